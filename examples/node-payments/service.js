'use strict';
// POST /payments with an Idempotency-Key, on tombstoned's SQL API: node-postgres (`pg`) and
// node:http. See examples/README.md for the contract the three examples share.
//
// Environment:
//   DATABASE_URL        the service role (USAGE on schema tombstoned, EXECUTE on its functions,
//                       and its own table `payments`, examples/payments.sql)
//   PAYMENTS_TOKENS     JSON: bearer token -> {"tenant": ..., "principal": ...}
//   PORT                default 8080; 0 picks a free port. The first line printed names it.
//   CLAIM_LOCK_TIMEOUT  how long a claim waits for an in-flight owner (default "2 seconds")
//   REPLAY_WINDOW       how long a key replays its answer (default "24 hours")

const http = require('node:http');
const { Pool } = require('pg');

const OPERATION = 'create-payment';
const APPLICATION_NAME = 'payments-node';
// ISO 4217 minor-unit exponents of the currencies this service takes.
const CURRENCIES = { EUR: 2, USD: 2, JPY: 0 };
const DEFAULT_CURRENCY = 'EUR';
const MAX_BODY_BYTES = 16 * 1024;
const ATTEMPTS = 3;

const TOKENS = JSON.parse(process.env.PAYMENTS_TOKENS || '{}');
const LOCK_TIMEOUT = process.env.CLAIM_LOCK_TIMEOUT || '2 seconds';
const REPLAY_WINDOW = process.env.REPLAY_WINDOW || '24 hours';

// Every statement takes its values as parameters.
const CLAIM = `SELECT outcome, status_code, response_body, resource_id
  FROM tombstoned.claim($1, $2, $3, $4, tombstoned.fingerprint($5::jsonb),
                        $6::interval, $7::interval)`;
const INSERT_PAYMENT = `INSERT INTO payments AS p
    (tenant_id, principal_id, request_id, amount_minor, currency, payee)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING p.payment_id::text AS payment_id, payment_body(p)::text AS body`;
const ENQUEUE = "SELECT tombstoned.enqueue_event($1, $2, 'payment.created', $3::jsonb)";
const COMPLETE = 'SELECT tombstoned.complete($1, $2, $3, $4, 201, $5::jsonb, $6) AS body';
const BY_REQUEST_ID = `SELECT p.principal_id = $1 AND p.amount_minor = $2 AND p.currency = $3
           AND p.payee = $4 AS same,
       payment_body(p)::text AS body
  FROM payments AS p
 WHERE p.tenant_id = $5 AND p.request_id = $6`;

/** The request is refused before any transaction: its key is not consumed. */
class Invalid extends Error {}
/** Run the whole transaction again (40001, 40P01, or a conflict that went away). */
class Again extends Error {}

const answer = (status, body, headers = {}) => ({ status, body, headers });
const problem = (status, title, headers = {}, extra = {}) =>
  answer(status, JSON.stringify({ status, title, ...extra }), headers);
const inProgress = () =>
  problem(409, 'a request with this Idempotency-Key is still in progress: retry later with the same key',
    { 'Retry-After': '1' });
const length = (s) => [...s].length; // in code points, as the other examples count

/** "12.5" -> 1250 in a currency of exponent 2; a JSON number is not accepted. */
function minorUnits(amount, exponent) {
  const match = typeof amount === 'string' && /^(0|[1-9][0-9]{0,11})(?:\.([0-9]+))?$/.exec(amount);
  const fraction = (match && match[2]) || '';
  if (!match || fraction.length > exponent) {
    throw new Invalid(`amount: a decimal string with at most ${exponent} decimals`);
  }
  // At most 12 + 2 digits: below 2^53, exact as a JS number.
  const minor = Number(match[1]) * 10 ** exponent + Number(fraction.padEnd(exponent, '0') || '0');
  if (minor <= 0) throw new Invalid('amount: must be positive');
  return minor;
}

function textField(doc, name, longest) {
  const value = doc[name];
  if (typeof value !== 'string' || length(value) < 1 || length(value) > longest) {
    throw new Invalid(`${name}: a string of 1 to ${longest} characters`);
  }
  return value;
}

/** The normalised intent: defaults applied, the amount in minor units. Its fingerprint is
 * tombstoned.fingerprint() of exactly this object. */
function parseIntent(raw) {
  let doc;
  try {
    doc = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(raw));
  } catch {
    throw new Invalid('the body is not JSON');
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) {
    throw new Invalid('the body must be a JSON object');
  }
  const currency = Object.hasOwn(doc, 'currency') ? doc.currency : DEFAULT_CURRENCY;
  if (typeof currency !== 'string' || !Object.hasOwn(CURRENCIES, currency)) {
    throw new Invalid(`currency: one of ${Object.keys(CURRENCIES).sort().join(', ')}`);
  }
  return {
    v: 1,
    request_id: textField(doc, 'request_id', 64),
    amount_minor: minorUnits(doc.amount, CURRENCIES[currency]),
    currency,
    payee: textField(doc, 'payee', 100),
  };
}

const isConnectionError = (e) => !e.code || e.code.startsWith('08') || /^E[A-Z]+$/.test(e.code);

/** One READ COMMITTED transaction: claim, then act on the outcome. */
async function attempt(client, tenant, principal, key, intent) {
  let stage = 'begin';
  let outcome, status, body, resource;
  try {
    await client.query('BEGIN ISOLATION LEVEL READ COMMITTED');
    stage = 'claim';
    const claimed = await client.query(CLAIM, [tenant, principal, OPERATION, key,
      JSON.stringify(intent), REPLAY_WINDOW, LOCK_TIMEOUT]);
    ({ outcome, status_code: status, response_body: body, resource_id: resource } = claimed.rows[0]);
    if (outcome === 'owner') {
      // Only the owner writes: the business row, its event, the answer.
      stage = 'write';
      const payment = await client.query(INSERT_PAYMENT, [tenant, principal, intent.request_id,
        intent.amount_minor, intent.currency, intent.payee]);
      resource = payment.rows[0].payment_id;
      await client.query(ENQUEUE, [tenant, resource, payment.rows[0].body]);
      const completed = await client.query(COMPLETE, [tenant, principal, OPERATION, key,
        payment.rows[0].body, resource]);
      body = completed.rows[0].body;
      status = 201;
    }
    // Commit right away, after a replay's read too: the cleaner waits for that share lock.
    // No remote call happened inside.
    stage = 'commit';
    await client.query('COMMIT');
  } catch (e) {
    if (stage !== 'commit') await client.query('ROLLBACK');
    if (e.code === '55P03') return inProgress(); // the key's owner is still in flight
    if (e.code === '23505' && e.constraint === 'payments_request_id_key') {
      return byRequestId(client, tenant, principal, intent);
    }
    if (e.code === '40001' || e.code === '40P01') throw new Again();
    if (e.code === '25006') { // a read-only server: a standby, mid-failover
      return problem(503, 'database read-only: retry with the same Idempotency-Key', { 'Retry-After': '1' });
    }
    if (stage === 'commit' && isConnectionError(e)) {
      return problem(503, 'outcome unknown: retry with the same Idempotency-Key', { 'Retry-After': '1' });
    }
    throw e;
  }
  const location = { Location: `/payments/${resource}` };
  switch (outcome) {
    case 'owner': return answer(201, body, location); // complete's text: what every replay sends
    case 'replay': return answer(status, body, { ...location, 'Idempotent-Replayed': 'true' });
    case 'key_reused': return problem(422, 'this Idempotency-Key was used for another request');
    case 'expired':
      return problem(410, 'beyond the replay window: look the payment up', location,
        { payment_id: resource });
    default: throw new Error(`unknown claim outcome ${outcome}`);
  }
}

/** The transaction rolled back on the business id: the request already has a payment, made
 * under another key. The same caller's same request gets it as a replay; anything else is a
 * conflict that says nothing of the other payment. */
async function byRequestId(client, tenant, principal, intent) {
  const found = await client.query(BY_REQUEST_ID, [principal, intent.amount_minor,
    intent.currency, intent.payee, tenant, intent.request_id]);
  if (found.rows.length === 0) throw new Again();
  if (!found.rows[0].same) return problem(409, 'request_id already names another payment');
  return answer(201, found.rows[0].body, { 'Idempotent-Replayed': 'true' });
}

async function createPayment(pool, tenant, principal, key, intent) {
  const client = await pool.connect();
  let broken;
  // A checked-out client whose connection dies also emits 'error' (the failed query rejects as
  // well): without a listener that event would end the process.
  const onError = (e) => { broken = e; };
  client.on('error', onError);
  try {
    for (let i = 0; i < ATTEMPTS; i += 1) {
      try {
        return await attempt(client, tenant, principal, key, intent);
      } catch (e) {
        if (!(e instanceof Again)) throw e;
      }
    }
    return problem(503, 'busy: retry with the same Idempotency-Key', { 'Retry-After': '1' });
  } catch (e) {
    broken = e; // a failed ROLLBACK or a lost connection: the pool drops this client
    throw e;
  } finally {
    client.off('error', onError);
    client.release(broken);
  }
}

async function handle(pool, req, raw) {
  if (req.url !== '/payments') return problem(404, 'not found');
  if (req.method !== 'POST') return problem(405, 'method not allowed', { Allow: 'POST' });
  const authorization = req.headers.authorization || '';
  const caller = authorization.startsWith('Bearer ') && Object.hasOwn(TOKENS, authorization.slice(7))
    ? TOKENS[authorization.slice(7)] : null;
  if (caller === null) {
    return problem(401, 'unauthenticated', { 'WWW-Authenticate': 'Bearer' });
  }
  const key = req.headers['idempotency-key'];
  if (typeof key !== 'string' || length(key) < 1 || length(key) > 255) {
    return problem(400, 'Idempotency-Key: a header of 1 to 255 characters');
  }
  let intent;
  try {
    intent = parseIntent(raw);
  } catch (e) {
    if (e instanceof Invalid) return problem(400, e.message);
    throw e;
  }
  try {
    return await createPayment(pool, caller.tenant, caller.principal, key, intent);
  } catch (e) {
    if (isConnectionError(e)) {
      return problem(503, 'database unavailable: retry with the same Idempotency-Key', { 'Retry-After': '1' });
    }
    throw e;
  }
}

function send(res, { status, body, headers }) {
  const data = Buffer.from(body, 'utf8');
  res.writeHead(status, {
    'Content-Type': status < 300 ? 'application/json' : 'application/problem+json',
    'Content-Length': data.length,
    ...headers,
  });
  res.end(data);
}

function main() {
  if (!process.env.DATABASE_URL) {
    console.error('DATABASE_URL is not set');
    process.exit(1);
  }
  const callers = TOKENS !== null && typeof TOKENS === 'object' ? Object.values(TOKENS) : [null];
  if (!callers.every((c) => c !== null && typeof c.tenant === 'string' && typeof c.principal === 'string')) {
    console.error('PAYMENTS_TOKENS: {"token": {"tenant": ..., "principal": ...}, ...}');
    process.exit(1);
  }
  const pool = new Pool({ connectionString: process.env.DATABASE_URL, application_name: APPLICATION_NAME, max: 8 });
  // An idle client's connection that breaks is reported here; the pool replaces it.
  pool.on('error', (e) => console.error(`idle database connection failed: ${e.message}`));
  const server = http.createServer((req, res) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size <= MAX_BODY_BYTES) chunks.push(chunk); // beyond it: read, not kept
    });
    req.on('end', () => {
      if (size > MAX_BODY_BYTES) {
        send(res, problem(413, `the body must be at most ${MAX_BODY_BYTES} bytes`));
        return;
      }
      handle(pool, req, Buffer.concat(chunks)).then((a) => send(res, a), (e) => {
        console.error(`create payment failed: ${e.stack || e}`);
        send(res, problem(500, 'internal error'));
      });
    });
  });
  server.listen(Number(process.env.PORT || 8080), '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}`);
  });
}

main();
