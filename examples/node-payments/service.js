'use strict';
// POST /payments with an Idempotency-Key, on the Express adapter of @tombstoned/client
// (clients/node): the same service as fastify.js, on the route declaration both share
// (business.js, which lists the environment). The adapter keeps the protocol; this file is the
// app: authentication, the body's bytes, where Location leads. See examples/README.md for the
// contract the examples share.

const express = require('express');
const { classify, httpAnswer, Idempotency } = require('@tombstoned/client');
const { idempotent } = require('@tombstoned/client/express');
const business = require('./business');

/** An answer of the client's (a problem, or a 503 from the database), sent as it is (bytes: a
 * string would get a charset added to its Content-Type). */
const send = (res, answer) =>
  res.status(answer.status).set(answer.headers).send(Buffer.from(answer.body, 'utf8'));

function app(pool, settings) {
  // --- README begin
  const idempotency = new Idempotency(pool, settings);
  const service = express();
  const body = express.raw({ type: () => true, limit: business.MAX_BODY_BYTES });
  service.post('/payments', authenticate, body, idempotent(idempotency, business.createPayment));
  // --- README end
  service.disable('x-powered-by');
  // Where Location leads: the caller's tenant's payment, or 404.
  service.get('/payments/:id', authenticate, async (req, res) => {
    try {
      const text = await business.paymentText(pool, req.caller, req.params.id);
      if (text === null) return send(res, httpAnswer(business.notFound('payment')));
      return res.type('application/json').send(Buffer.from(text, 'utf8'));
    } catch (e) {
      // The client's answer to a database error: 503 + Retry-After when it is unavailable.
      return send(res, httpAnswer(classify(e, { fromDriver: true })));
    }
  });
  service.use((req, res) => send(res, httpAnswer(business.notFound('route'))));
  // The body parser's refusals (the key was not consumed), and anything else: a 500 that says
  // nothing of it.
  service.use((err, req, res, next) => { // eslint-disable-line no-unused-vars
    if (err.type === 'entity.too.large') return send(res, httpAnswer(business.tooLarge()));
    if (err.status >= 400 && err.status < 500) return send(res, httpAnswer(business.unreadable()));
    console.error(`create payment failed: ${err.stack || err}`);
    return send(res, httpAnswer(err));
  });
  return service;
}

/** The caller from its bearer token, before the route (a 401 problem otherwise). */
function authenticate(req, res, next) {
  try {
    req.caller = business.callerOf(req.get('authorization'));
  } catch (refused) {
    send(res, httpAnswer(refused));
    return;
  }
  next();
}

const { pool, settings, port } = business.environment('payments-node');
const server = app(pool, settings).listen(port, '127.0.0.1', () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
