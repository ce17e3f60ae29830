'use strict';
// POST /payments with an Idempotency-Key, on the Fastify adapter of @tombstoned/client
// (clients/node): the same service as service.js (Express), on the route declaration both share
// (business.js, which lists the environment). The adapter keeps the protocol; this file is the
// app: authentication, the body's bytes, where Location leads. See examples/README.md for the
// contract the examples share.

const Fastify = require('fastify');
const { classify, httpAnswer, Idempotency, InvalidRequestError } = require('@tombstoned/client');
const { idempotent } = require('@tombstoned/client/fastify');
const business = require('./business');

/** An answer of the client's (a problem, or a 503 from the database), sent as it is (bytes: a
 * string would get a charset added to its Content-Type). */
const send = (reply, answer) =>
  reply.code(answer.status).headers(answer.headers).send(Buffer.from(answer.body, 'utf8'));

/** The caller from its bearer token, before the route (a 401 problem otherwise). */
async function authenticate(request) {
  request.caller = business.callerOf(request.headers.authorization);
}

function app(pool, settings) {
  const service = Fastify({ bodyLimit: business.MAX_BODY_BYTES });
  // The body's bytes, whatever its type: the route's intent reads them (business.js).
  service.removeAllContentTypeParsers();
  service.addContentTypeParser('*', { parseAs: 'buffer' }, (request, bytes, done) => {
    done(null, bytes);
  });
  // --- README begin
  const idempotency = new Idempotency(pool, settings);
  service.post('/payments', { preHandler: authenticate },
    idempotent(idempotency, business.createPayment));
  // --- README end
  // Where Location leads: the caller's tenant's payment, or 404.
  service.get('/payments/:id', { preHandler: authenticate }, async (request, reply) => {
    try {
      const text = await business.paymentText(pool, request.caller, request.params.id);
      if (text === null) return send(reply, httpAnswer(business.notFound('payment')));
      return reply.type('application/json').send(Buffer.from(text, 'utf8'));
    } catch (e) {
      // The client's answer to a database error: 503 + Retry-After when it is unavailable.
      return send(reply, httpAnswer(classify(e, { fromDriver: true })));
    }
  });
  service.setNotFoundHandler((request, reply) =>
    send(reply, httpAnswer(business.notFound('route'))));
  // The authentication's refusal and the body parser's (the key was not consumed), and anything
  // else: a 500 that says nothing of it.
  service.setErrorHandler((error, request, reply) => {
    if (error instanceof InvalidRequestError) return send(reply, httpAnswer(error));
    if (error.code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
      return send(reply, httpAnswer(business.tooLarge()));
    }
    if (error.statusCode >= 400 && error.statusCode < 500) {
      return send(reply, httpAnswer(business.unreadable()));
    }
    request.log.error({ err: error }, 'create payment failed');
    return send(reply, httpAnswer(error));
  });
  return service;
}

const { pool, settings, port } = business.environment('payments-fastify');
app(pool, settings).listen({ port, host: '127.0.0.1' }).then((address) => {
  console.log(`listening on ${address}`);
}, (error) => {
  console.error(`cannot listen: ${error.message}`);
  process.exit(1);
});
