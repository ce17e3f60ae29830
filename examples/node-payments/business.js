'use strict';
// The business of the Node "create payment" sample apps, shared by both: service.js (on the
// Express adapter of @tombstoned/client) and fastify.js (on its Fastify adapter) serve the same
// route declaration. Who the callers are, what a payment request means, the payment row; nothing
// of the protocol is here: the adapters keep it. See examples/README.md for the contract the
// examples share.
//
// Environment:
//   DATABASE_URL        the service role (USAGE on schema tombstoned, EXECUTE on its functions,
//                       its operation create-payment, and its own table `payments`,
//                       examples/payments.sql)
//   PAYMENTS_TOKENS     JSON: bearer token -> {"tenant": ..., "principal": ...}
//   PORT                default 8082 (Python's 8081, Rust's 8083); 0 picks a free port. The first
//                       line printed names it.
//   CLAIM_LOCK_TIMEOUT  how long a claim waits for an in-flight owner (default "2 seconds")
//   REPLAY_WINDOW       how long a key replays its answer (default "24 hours")

const { Pool } = require('pg');
const { InvalidRequestError } = require('@tombstoned/client');

// ISO 4217 minor-unit exponents of the currencies this service takes.
const CURRENCIES = { EUR: 2, USD: 2, JPY: 0 };
const DEFAULT_CURRENCY = 'EUR';
const MAX_BODY_BYTES = 16 * 1024;

const TOKENS = JSON.parse(process.env.PAYMENTS_TOKENS || '{}');

// Every statement takes its values as parameters.
const INSERT_PAYMENT = `INSERT INTO payments AS p
    (tenant_id, principal_id, request_id, amount_minor, currency, payee)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING p.payment_id::text AS payment_id, payment_body(p) AS body`;
const BY_REQUEST_ID = `SELECT p.principal_id = $1 AND p.amount_minor = $2 AND p.currency = $3
           AND p.payee = $4 AS same,
       payment_body(p)::text AS body, p.payment_id::text AS payment_id
  FROM payments AS p
 WHERE p.tenant_id = $5 AND p.request_id = $6`;
const BY_ID = `SELECT payment_body(p)::text AS body FROM payments AS p
 WHERE p.tenant_id = $1 AND p.payment_id::text = $2`;

const invalid = (detail) => new InvalidRequestError(detail);
const length = (s) => [...s].length; // in code points, as the other examples count

/** The caller of a bearer token: the scope's tenant and principal come from here only. */
function callerOf(authorization) {
  const token = (authorization || '').startsWith('Bearer ') ? authorization.slice(7) : null;
  if (token === null || !Object.hasOwn(TOKENS, token)) {
    throw new InvalidRequestError('a valid bearer token is required', {
      status: 401,
      problem: 'unauthenticated',
      title: 'Unauthenticated',
      headers: { 'WWW-Authenticate': 'Bearer' },
    });
  }
  return TOKENS[token];
}

/** "12.5" -> 1250 in a currency of exponent 2; a JSON number is not accepted. */
function minorUnits(amount, exponent) {
  const match = typeof amount === 'string' && /^(0|[1-9][0-9]{0,11})(?:\.([0-9]+))?$/.exec(amount);
  const fraction = (match && match[2]) || '';
  if (!match || fraction.length > exponent) {
    throw invalid(`amount: a decimal string with at most ${exponent} decimals`);
  }
  // At most 12 + 2 digits: below 2^53, exact as a JS number.
  const minor = Number(match[1]) * 10 ** exponent + Number(fraction.padEnd(exponent, '0') || '0');
  if (minor <= 0) throw invalid('amount: must be positive');
  return minor;
}

function textField(doc, name, longest) {
  const value = doc[name];
  if (typeof value !== 'string' || length(value) < 1 || length(value) > longest) {
    throw invalid(`${name}: a string of 1 to ${longest} characters`);
  }
  return value;
}

/** The normalised intent of the body's bytes: defaults applied, the amount in minor units. Its
 * fingerprint is tombstoned.fingerprint() of exactly this object. */
function parseIntent(raw) {
  let doc;
  try {
    doc = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(raw));
  } catch {
    throw invalid('the body is not JSON');
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) {
    throw invalid('the body must be a JSON object');
  }
  const currency = Object.hasOwn(doc, 'currency') ? doc.currency : DEFAULT_CURRENCY;
  if (typeof currency !== 'string' || !Object.hasOwn(CURRENCIES, currency)) {
    throw invalid(`currency: one of ${Object.keys(CURRENCIES).sort().join(', ')}`);
  }
  return {
    v: 1,
    request_id: textField(doc, 'request_id', 64),
    amount_minor: minorUnits(doc.amount, CURRENCIES[currency]),
    currency,
    payee: textField(doc, 'payee', 100),
  };
}

// --- README begin
/** POST /payments: the route each adapter runs under the protocol, after the app's
 * authentication (req.caller) and with the body's bytes (req.body). */
const createPayment = {
  operation: 'create-payment',
  caller: (req) => req.caller,
  intent: (req) => parseIntent(req.body),
  resourceUrl: (id) => `/payments/${id}`,
  resourceName: 'payment', // the 410 names payment_id and payment_url
  // Only the owner writes: the payment row, its event, the answer complete() stores.
  handler: async (tx) => {
    const { tenant, principal } = tx.scope;
    const { request_id: requestId, amount_minor: amount, currency, payee } = tx.intent;
    const { rows: [payment] } = await tx.query(INSERT_PAYMENT,
      [tenant, principal, requestId, amount, currency, payee]);
    await tx.enqueueEvent(payment.payment_id, 'payment.created', payment.body);
    return tx.complete(201, payment.body, payment.payment_id);
  },
  // The business id, the second line of defence: a new key for a request that already has a
  // payment. The same caller's same request gets it as a replay (200: this request created
  // nothing); anything else a conflict that says nothing of the other payment.
  businessId: {
    constraint: 'payments_request_id_key',
    read: async (client, scope, intent) => {
      const { rows } = await client.query(BY_REQUEST_ID, [scope.principal, intent.amount_minor,
        intent.currency, intent.payee, scope.tenant, intent.request_id]);
      if (rows.length === 0) return null;
      const [found] = rows;
      return { same: found.same, bodyText: found.body, resourceId: found.payment_id };
    },
  },
};
// --- README end

/** The caller's tenant's payment as its body's text (where Location leads), or null. */
async function paymentText(pool, caller, id) {
  const { rows } = await pool.query(BY_ID, [caller.tenant, id]);
  return rows.length === 0 ? null : rows[0].body;
}

/** A 404 problem. */
const notFound = (what) =>
  new InvalidRequestError(`no such ${what}`, { status: 404, problem: 'not-found', title: 'Not found' });

/** A 413 problem: the body is longer than MAX_BODY_BYTES. */
const tooLarge = () =>
  new InvalidRequestError(`the body must be at most ${MAX_BODY_BYTES} bytes`, {
    status: 413,
    problem: 'payload-too-large',
    title: 'The request body is too large',
  });

/** A request the framework could not read (its own 4xx): a 400 problem. */
const unreadable = () => new InvalidRequestError('the request could not be read');

/** The environment checked: the pool (its sessions named `applicationName`), the runner's
 * settings, the port. Exits with one line when something is missing. */
function environment(applicationName) {
  if (!process.env.DATABASE_URL) {
    console.error('DATABASE_URL is not set');
    process.exit(1);
  }
  const callers = TOKENS !== null && typeof TOKENS === 'object' ? Object.values(TOKENS) : [null];
  const valid = (c) => c !== null && typeof c.tenant === 'string'
    && typeof c.principal === 'string';
  if (!callers.every(valid)) {
    console.error('PAYMENTS_TOKENS: {"token": {"tenant": ..., "principal": ...}, ...}');
    process.exit(1);
  }
  const pool = new Pool({
    connectionString: process.env.DATABASE_URL,
    application_name: applicationName,
    max: 8,
  });
  // An idle client's connection that breaks is reported here; the pool replaces it.
  pool.on('error', (e) => console.error(`idle database connection failed: ${e.message}`));
  const settings = {
    lockTimeout: process.env.CLAIM_LOCK_TIMEOUT || '2 seconds',
    replayWindow: process.env.REPLAY_WINDOW || '24 hours',
  };
  return { pool, settings, port: Number(process.env.PORT || 8082) };
}

module.exports = {
  MAX_BODY_BYTES,
  callerOf,
  createPayment,
  environment,
  notFound,
  paymentText,
  tooLarge,
  unreadable,
};
