// The core against the real SQL API, as the service role: every outcome of claim and lookup,
// complete's text, enqueueEvent, and each SQLSTATE the functions raise mapped to its error.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  claim,
  ClaimedTwiceError,
  classify,
  complete,
  enqueueEvent,
  Expired,
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
  OPERATION,
  prepareService,
  servicePool,
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
