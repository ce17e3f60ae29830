// The core against the real SQL API, as the service role: every outcome of claim and lookup,
// complete's text, enqueueEvent, and each SQLSTATE the functions raise mapped to its error.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import pg from 'pg';

import {
  claim,
  ClaimedTwiceError,
  classify,
  complete,
  enqueueEvent,
  Expired,
  httpAnswer,
  InProgressError,
  InvalidArgumentError,
  KeyReused,
  lookup,
  NotAllowedError,
  NotClaimedError,
  Owner,
  Replay,
  SerializationFailureError,
  WrongIsolationError,
} from '@tombstoned/client';

import {
  admin,
  adminRows,
  env,
  expireKey,
  Holder,
  NOT_GRANTED,
  OPERATION,
  prepareService,
  servicePool,
  setUpRole,
  unique,
  waitForLockWait,
} from './support/env.js';

const APP = 'node-suite-core';
const pool = servicePool(APP);
const scope = { tenant: 'acme', principal: 'billing', operation: OPERATION };
const schema = { schema: env.schema };

before(prepareService);
after(async () => {
  await pool.end();
  await admin.end();
});

/** `work` in a transaction of its own on a pooled connection; rolled back if it throws. */
async function inTransaction(work, begin = 'BEGIN ISOLATION LEVEL READ COMMITTED') {
  const client = await pool.connect();
  try {
    await client.query(begin);
    try {
      const value = await work(client);
      await client.query('COMMIT');
      return value;
    } catch (error) {
      await client.query('ROLLBACK');
      throw error;
    }
  } finally {
    client.release();
  }
}

test('claim, complete, replay, reuse, expiry and lookup: every outcome', async () => {
  const key = unique('core');
  const intent = { v: 1, request_id: key, name: 'bolt' };
  const body = { z: 1, a: [1, 2], widget: 'bolt' };
  const resource = unique('bolt');

  const text = await inTransaction(async (client) => {
    assert.equal(await lookup(client, scope, key, intent, schema), null, 'nothing committed yet');
    const outcome = await claim(client, scope, key, intent, '1 hour', '2 seconds', schema);
    assert.ok(outcome instanceof Owner);
    assert.equal(outcome.kind, 'owner');
    assert.ok(outcome.replayDeadline instanceof Date);
    const event = await enqueueEvent(
      client, scope.tenant, resource, 'widget.created', body, schema,
    );
    assert.match(event, /^[0-9a-f-]{36}$/);
    return complete(client, scope, key, 201, body, resource, schema);
  });
  // jsonb's text (keys by length, then bytes; a space after ':' and ','), not JSON.stringify's.
  assert.equal(text, '{"a": [1, 2], "z": 1, "widget": "bolt"}');

  // The intent spelled otherwise (key order) is the same intent: a replay, byte for byte.
  const replay = await inTransaction((client) =>
    claim(client, scope, key, { name: 'bolt', request_id: key, v: 1 }, '1 hour', 1000, schema));
  assert.ok(replay instanceof Replay);
  assert.deepEqual(
    [replay.statusCode, replay.bodyText, replay.resourceId],
    [201, text, resource],
  );
  const looked = await inTransaction((client) => lookup(client, scope, key, intent, schema));
  assert.ok(looked instanceof Replay);
  assert.equal(looked.bodyText, text);

  const other = { ...intent, name: 'nut' };
  assert.ok(
    (await inTransaction((client) => claim(client, scope, key, other, '1 hour', 1000, schema)))
      instanceof KeyReused,
  );
  assert.ok((await inTransaction((client) => lookup(client, scope, key, other, schema))) instanceof
    KeyReused);

  await expireKey(key);
  const expired = await inTransaction((client) =>
    claim(client, scope, key, intent, '1 hour', 1000, schema));
  assert.ok(expired instanceof Expired);
  assert.equal(expired.resourceId, resource);
  assert.equal(expired.expiredAt, null, 'not tombstoned yet');
  // Reuse stays refused after expiry.
  assert.ok(
    (await inTransaction((client) => claim(client, scope, key, other, '1 hour', 1000, schema)))
      instanceof KeyReused,
  );
  const events = await adminRows(
    `SELECT count(*)::int AS n FROM ${env.schema}.outbox_events WHERE aggregate_id = $1`,
    [resource],
  );
  assert.equal(events[0].n, 1);
});

test('22023: an invalid argument names it; nothing is written', async () => {
  const error = await inTransaction((client) =>
    claim(client, scope, '', { v: 1 }, '1 hour', 1000, schema)).catch((e) => e);
  assert.ok(error instanceof InvalidArgumentError, String(error));
  assert.equal(error.sqlstate, '22023');
  assert.equal(error.argument, 'idempotency_key');

  const key = unique('core-22023');
  const status = await inTransaction(async (client) => {
    await claim(client, scope, key, { v: 1 }, '1 hour', 1000, schema);
    return complete(client, scope, key, 503, { a: 1 }, null, schema);
  }).catch((e) => e);
  assert.ok(status instanceof InvalidArgumentError);
  assert.equal(status.argument, 'status_code');
  const window = await inTransaction((client) =>
    claim(client, scope, key, { v: 1 }, '-1 hour', 1000, schema)).catch((e) => e);
  assert.equal(window.argument, 'replay_window');
});

test('TS002: complete without owning the key', async () => {
  const error = await inTransaction((client) =>
    complete(client, scope, unique('core-ts002'), 201, { a: 1 }, null, schema)).catch((e) => e);
  assert.ok(error instanceof NotClaimedError, String(error));
  assert.equal(error.sqlstate, 'TS002');
});

test('TS004: one key claimed twice in one transaction', async () => {
  const key = unique('core-ts004');
  const error = await inTransaction(async (client) => {
    await claim(client, scope, key, { v: 1 }, '1 hour', 1000, schema);
    await claim(client, scope, key, { v: 1 }, '1 hour', 1000, schema);
  }).catch((e) => e);
  assert.ok(error instanceof ClaimedTwiceError, String(error));
  assert.equal(error.sqlstate, 'TS004');
});

test('TS005: an endpoint-internal claim function outside READ COMMITTED', async () => {
  const error = await inTransaction(
    (client) =>
      client.query(
        `SELECT * FROM ${env.schema}.endpoint_claim_rejected('acme', 'billing', $1, $2,
            '\\x00'::bytea, 422::smallint, '{}'::jsonb, 1::bigint, '1s')`,
        [OPERATION, unique('core-ts005')],
      ),
    'BEGIN ISOLATION LEVEL REPEATABLE READ',
  ).catch((e) => e);
  assert.equal(error.code, 'TS005', String(error));
  const classified = classify(error);
  assert.ok(classified instanceof WrongIsolationError);
  assert.equal(classified.sqlstate, 'TS005');
});

test('42501: claim, complete and lookup outside the role\'s operations reveal nothing', async () => {
  const elsewhere = { ...scope, operation: NOT_GRANTED };
  const [held, fresh] = [unique('core-42501-held'), unique('core-42501-fresh')];
  // A record of `held` in that operation, made by the admin (a superuser may use any).
  const owner = await admin.connect();
  try {
    await owner.query('BEGIN ISOLATION LEVEL READ COMMITTED');
    await claim(owner, elsewhere, held, { v: 1 }, '1 hour', '2 seconds', schema);
    await complete(owner, elsewhere, held, 201, { secret: held }, 'res-1', schema);
    await owner.query('COMMIT');
  } finally {
    owner.release();
  }
  const calls = {
    claim: (client, key) => claim(client, elsewhere, key, { v: 1 }, '1 hour', 1000, schema),
    complete: (client, key) => complete(client, elsewhere, key, 201, {}, null, schema),
    lookup: (client, key) => lookup(client, elsewhere, key, { v: 1 }, schema),
  };
  for (const [name, call] of Object.entries(calls)) {
    const refusals = [];
    for (const key of [held, fresh]) {
      const error = await inTransaction((client) => call(client, key)).catch((e) => e);
      assert.ok(error instanceof NotAllowedError, `${name}: ${error}`);
      assert.equal(error.sqlstate, '42501');
      assert.ok(error.message.includes(NOT_GRANTED) && error.message.includes(env.serviceRole));
      refusals.push(error.message);
      const answer = httpAnswer(error);
      assert.equal(answer.status, 500);
      assert.equal(JSON.parse(answer.body).detail, 'Internal error.');
      for (const secret of [NOT_GRANTED, env.serviceRole, '42501']) {
        assert.ok(!answer.body.includes(secret), `${name}: the answer names ${secret}`);
      }
    }
    assert.equal(refusals[0], refusals[1], `${name} tells a key that exists from one that does not`);
  }
  const rows = await adminRows(
    `SELECT idempotency_key, response_body IS NOT NULL AS answered
       FROM ${env.schema}.idempotency_records WHERE idempotency_key = ANY($1)`,
    [[held, fresh]],
  );
  assert.deepEqual(rows, [{ idempotency_key: held, answered: true }], 'nothing written');
});

test('42501: enqueueEvent by a role that holds no operation', async () => {
  const role = `${env.serviceRole}_idle`;
  await admin.query(`DROP ROLE IF EXISTS ${role}`);
  await admin.query(`CREATE ROLE ${role} LOGIN PASSWORD 'idle'`);
  await setUpRole(role, null);
  const url = new URL(env.serviceUrl);
  url.username = role;
  url.password = 'idle';
  const idle = new pg.Client({ connectionString: url.toString() });
  await idle.connect();
  const aggregate = unique('core-42501-agg');
  try {
    const error = await enqueueEvent(idle, 'acme', aggregate, 'widget.created', {}, schema)
      .catch((e) => e);
    assert.ok(error instanceof NotAllowedError, String(error));
    assert.equal(error.sqlstate, '42501');
  } finally {
    await idle.end();
    await admin.query(`DROP OWNED BY ${role}; DROP ROLE ${role}`);
  }
  const events = await adminRows(
    `SELECT count(*)::int AS n FROM ${env.schema}.outbox_events WHERE aggregate_id = $1`,
    [aggregate],
  );
  assert.equal(events[0].n, 0);
  // The suite's role, which holds an operation, may.
  await inTransaction((client) =>
    enqueueEvent(client, 'acme', aggregate, 'widget.created', {}, schema));
});

test('42501: the service role reads no table of the schema', async () => {
  const error = await pool
    .query(`SELECT 1 FROM ${env.schema}.idempotency_records LIMIT 1`)
    .catch((e) => e);
  const classified = classify(error);
  assert.ok(classified instanceof NotAllowedError, String(error));
  assert.equal(classified.sqlstate, '42501');
});

test('55P03: the owner still in flight after lock_timeout', async () => {
  const key = unique('core-55p03');
  const intent = { v: 1, request_id: key };
  const holder = await Holder.claim(scope, key, intent);
  try {
    const error = await inTransaction((client) =>
      claim(client, scope, key, intent, '1 hour', '300 milliseconds', schema)).catch((e) => e);
    assert.ok(error instanceof InProgressError, String(error));
    assert.equal(error.sqlstate, '55P03');
    assert.equal(error.retryAfter, 1);
  } finally {
    await holder.end('ROLLBACK');
  }
});

test('40001: under REPEATABLE READ a claim that waited cannot see the owner commit', async () => {
  const key = unique('core-40001');
  const intent = { v: 1, request_id: key };
  const holder = await Holder.claim(scope, key, intent);
  const waiting = inTransaction(async (client) => {
    await client.query('SELECT 1'); // the snapshot is taken
    return claim(client, scope, key, intent, '1 hour', '20 seconds', schema);
  }, 'BEGIN ISOLATION LEVEL REPEATABLE READ').catch((e) => e);
  await waitForLockWait(APP);
  await holder.complete({ held: true });
  await holder.end('COMMIT');
  const error = await waiting;
  assert.ok(error instanceof SerializationFailureError, String(error));
  assert.equal(error.sqlstate, '40001');
});
