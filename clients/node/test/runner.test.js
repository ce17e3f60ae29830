// The transaction runner (Idempotency.execute) against the real SQL API: the owner's commit and
// the replay, a handler that returns without completing (TS003), a handler that raises, 40001
// and a real deadlock retried, a read-only server, the commit's acknowledgement lost behind a
// proxy, a connection lost before COMMIT, a terminated session, the pool's timeout, class 53,
// 42501, the business id's 23505, the api_version() check, and a single Client.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import pg from 'pg';

import {
  ClaimNotCompletedError,
  Completed,
  DatabaseUnavailableError,
  DuplicateBusinessId,
  httpAnswer,
  Idempotency,
  NotAllowedError,
  OutcomeUnknownError,
  OutOfResourcesError,
  ReadOnlyError,
  Replay,
  ReplayByBusinessId,
  RetriesExhaustedError,
  UnknownApiVersionError,
} from '@tombstoned/client';

import {
  admin,
  adminRows,
  env,
  gate,
  Holder,
  OPERATION,
  prepareService,
  recordsOf,
  servicePool,
  unique,
  waitForLockWait,
  widgetsOf,
} from './support/env.js';
import { afterCommit, beforeStatement, startProxy } from './support/proxy.js';
import { insertWidget, widgetBusinessId, writeWidget } from './support/widgets.js';

const APP = 'node-suite-runner';
const pool = servicePool(APP);
const idempotency = new Idempotency(pool, { schema: env.schema, lockTimeout: '10 seconds' });
const scope = { tenant: 'acme', principal: 'billing', operation: OPERATION };
const cleanups = [];

before(prepareService);
after(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  await pool.end();
  await admin.end();
});

const intentOf = (requestId, name = 'bolt') => ({ v: 1, request_id: requestId, name });

/** A handler that counts its runs and writes the widget. */
function counted(write = writeWidget) {
  const handler = async (tx) => {
    handler.runs += 1;
    return write(tx, handler.runs);
  };
  handler.runs = 0;
  return handler;
}

/** Raises `sqlstate` from the server, as a statement of the transaction would. */
const raise = (tx, sqlstate) =>
  tx.query(
    `DO $$ BEGIN RAISE EXCEPTION 'raised by the test' USING ERRCODE = '${sqlstate}'; END $$`,
  );

test('the owner commits complete\'s text; the retry replays it byte for byte', async () => {
  const key = unique('run');
  const handler = counted();
  const done = await idempotency.execute(scope, key, intentOf(key), handler);
  assert.ok(done instanceof Completed);
  assert.equal(done.statusCode, 201);
  assert.ok(done.replayDeadline instanceof Date);
  const stored = await adminRows(
    `SELECT response_body::text AS body, resource_id FROM ${env.schema}.idempotency_records
      WHERE idempotency_key = $1`,
    [key],
  );
  assert.equal(done.bodyText, stored[0].body, 'the first answer is the stored text');
  assert.equal(done.resourceId, stored[0].resource_id);

  const again = await idempotency.execute(scope, key, intentOf(key), handler);
  assert.ok(again instanceof Replay);
  assert.equal(again.bodyText, done.bodyText);
  assert.equal(handler.runs, 1, 'a replay runs no business write');
  assert.equal(await widgetsOf(key), 1);
  const idle = await adminRows(
    `SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE application_name = $1 AND state LIKE 'idle in transaction%'`,
    [APP],
  );
  assert.equal(idle[0].n, 0, 'every transaction ended: the cleaner waits for none');
});

test('TS003: a handler that returns without completing cannot commit', async () => {
  const key = unique('run-ts003');
  const error = await idempotency
    .execute(scope, key, intentOf(key), async (tx) => {
      await insertWidget(tx); // written, and tx.complete never called
    })
    .catch((e) => e);
  assert.ok(error instanceof ClaimNotCompletedError, String(error));
  assert.equal(error.sqlstate, 'TS003');
  assert.equal(await widgetsOf(key), 0, 'the business row is gone with the claim');
  assert.equal(await recordsOf(key), 0);
  const retried = await idempotency.execute(scope, key, intentOf(key), writeWidget);
  assert.ok(retried instanceof Completed, 'the key was free');
});

test('a handler raising after its business write: nothing committed, the key free', async () => {
  const key = unique('run-raise');
  const failure = new Error('the handler failed after its write');
  const error = await idempotency
    .execute(scope, key, intentOf(key), async (tx) => {
      await writeWidget(tx);
      throw failure;
    })
    .catch((e) => e);
  assert.equal(error, failure, 'the handler\'s own error, as it is');
  assert.equal(await widgetsOf(key), 0);
  assert.equal(await recordsOf(key), 0);
  const retried = await idempotency.execute(scope, key, intentOf(key), writeWidget);
  assert.ok(retried instanceof Completed);
});

test('40001: the whole transaction runs again, at most three times', async () => {
  const key = unique('run-40001');
  const once = counted(async (tx, run) => {
    if (run === 1) await raise(tx, '40001');
    return writeWidget(tx);
  });
  assert.ok((await idempotency.execute(scope, key, intentOf(key), once)) instanceof Completed);
  assert.equal(once.runs, 2);

  const busy = unique('run-40p01');
  const always = counted(async (tx) => {
    await writeWidget(tx);
    await raise(tx, '40P01');
  });
  const error = await idempotency.execute(scope, busy, intentOf(busy), always).catch((e) => e);
  assert.ok(error instanceof RetriesExhaustedError, String(error));
  assert.equal(error.attempts, 3);
  assert.equal(error.sqlstate, '40P01');
  assert.equal(always.runs, 3);
  assert.equal(await widgetsOf(busy), 0);
  assert.equal(httpAnswer(error).status, 503);
});

test('a real deadlock between two business writes: a victim runs again and completes', async () => {
  const rows = [unique('lock-a'), unique('lock-b')];
  await admin.query(
    'CREATE TABLE IF NOT EXISTS public.counters (id text PRIMARY KEY, n int NOT NULL)',
  );
  await admin.query(`ALTER TABLE public.counters OWNER TO ${env.serviceRole}`);
  await admin.query("INSERT INTO public.counters VALUES ($1, 0), ($2, 0)", rows);
  const holding = [gate(), gate()];
  const go = gate();
  const failures = [];
  const writer = (first, second, held) =>
    counted(async (tx, run) => {
      try {
        await tx.query('UPDATE public.counters SET n = n + 1 WHERE id = $1', [first]);
        if (run === 1) {
          held.open();
          await go.opened;
        }
        await tx.query('UPDATE public.counters SET n = n + 1 WHERE id = $1', [second]);
        return await writeWidget(tx);
      } catch (error) {
        failures.push(`run ${run} on ${first}: ${error.code} ${error.message}`);
        throw error;
      }
    });
  const a = writer(rows[0], rows[1], holding[0]);
  const b = writer(rows[1], rows[0], holding[1]);
  const keys = [unique('run-deadlock-a'), unique('run-deadlock-b')];
  const first = idempotency.execute(scope, keys[0], intentOf(keys[0]), a);
  const second = idempotency.execute(scope, keys[1], intentOf(keys[1]), b);
  await Promise.all(holding.map((h) => h.opened)); // each holds its first row
  go.open(); // each now wants the other's: PostgreSQL picks a victim (40P01)
  const results = await Promise.all([first, second]);
  assert.ok(results.every((r) => r instanceof Completed));
  // PostgreSQL aborts one of them, rarely both (each detector may see the cycle first).
  assert.ok(failures.length >= 1, 'a deadlock was detected');
  assert.ok(failures.every((f) => f.includes(': 40P01 ')), failures.join('; '));
  assert.equal(a.runs + b.runs, 2 + failures.length, 'each victim ran once more');
  const counters = await adminRows('SELECT n FROM public.counters WHERE id = ANY($1)', [rows]);
  assert.deepEqual(counters.map((r) => r.n), [2, 2], 'the victim\'s first run left nothing');
});

test('25006: a read-only server answers 503, nothing written', async () => {
  const readOnly = servicePool('node-suite-readonly', {
    options: '-c default_transaction_read_only=on',
  });
  cleanups.push(() => readOnly.end());
  const runner = new Idempotency(readOnly, { schema: env.schema });
  const key = unique('run-25006');
  const error = await runner.execute(scope, key, intentOf(key), writeWidget).catch((e) => e);
  assert.ok(error instanceof ReadOnlyError, String(error));
  assert.equal(error.sqlstate, '25006');
  assert.equal(await recordsOf(key), 0);
  assert.deepEqual(
    [httpAnswer(error).status, httpAnswer(error).headers['Retry-After']],
    [503, '2'],
  );
});

/** A runner on a pool of the service role whose connections go through a proxy of their own. */
async function throughProxy(applicationName) {
  const url = new URL(env.serviceUrl);
  const proxy = await startProxy({ host: url.hostname, port: Number(url.port) });
  cleanups.push(() => proxy.close());
  url.host = `127.0.0.1:${proxy.port}`;
  const proxied = servicePool(applicationName, { connectionString: url.toString(), max: 1 });
  cleanups.push(() => proxied.end());
  return { proxy, runner: new Idempotency(proxied, { schema: env.schema }) };
}

test('the commit acknowledgement lost: outcome unknown, and the retry replays', async () => {
  const { proxy, runner } = await throughProxy('node-suite-proxy');
  const key = unique('run-commit-lost');
  assert.ok(
    (await runner.execute(scope, unique('warm'), intentOf(unique('warm')), writeWidget))
      instanceof Completed,
    'through the proxy, before it cuts anything',
  );

  proxy.arm(afterCommit);
  const error = await runner.execute(scope, key, intentOf(key), writeWidget).catch((e) => e);
  assert.equal(proxy.cuts, 1);
  assert.ok(error instanceof OutcomeUnknownError, String(error));
  assert.equal(httpAnswer(error).status, 503);
  assert.equal(
    JSON.parse(httpAnswer(error).body).type,
    'tag:tombstoned,2026:problem:outcome-unknown',
  );

  // The COMMIT reached the server: the same key replays what was committed, nothing twice.
  const retry = await idempotency.execute(scope, key, intentOf(key), writeWidget);
  assert.ok(retry instanceof Replay, `the retry got ${retry.kind}`);
  assert.equal(await widgetsOf(key), 1);
  const stored = await adminRows(
    `SELECT resource_id FROM ${env.schema}.idempotency_records WHERE idempotency_key = $1`,
    [key],
  );
  assert.equal(retry.resourceId, stored[0].resource_id);
});

test('the connection lost before COMMIT: unavailable, nothing committed', async () => {
  const { proxy, runner } = await throughProxy('node-suite-proxy-2');
  const key = unique('run-lost-early');
  proxy.arm(beforeStatement('INSERT INTO public.widgets'));
  const error = await runner.execute(scope, key, intentOf(key), writeWidget).catch((e) => e);
  assert.equal(proxy.cuts, 1);
  assert.ok(error instanceof DatabaseUnavailableError, String(error));
  assert.deepEqual(
    [httpAnswer(error).status, httpAnswer(error).headers['Retry-After']],
    [503, '2'],
  );
  const retry = await runner.execute(scope, key, intentOf(key), writeWidget);
  assert.ok(retry instanceof Completed, 'nothing was committed: the retry owns the key');
});

test('57P01: a session terminated while its claim waits', async () => {
  const key = unique('run-57p01');
  const holder = await Holder.claim(scope, key, intentOf(key));
  try {
    const waiting = idempotency.execute(scope, key, intentOf(key), writeWidget).catch((e) => e);
    const pid = await waitForLockWait(APP);
    await admin.query('SELECT pg_terminate_backend($1)', [pid]);
    const error = await waiting;
    assert.ok(error instanceof DatabaseUnavailableError, String(error));
    assert.equal(error.sqlstate, '57P01');
  } finally {
    await holder.end('ROLLBACK');
  }
});

test('no pooled connection within the pool\'s timeout: unavailable', async () => {
  const small = servicePool('node-suite-small', { max: 1, connectionTimeoutMillis: 300 });
  cleanups.push(() => small.end());
  const runner = new Idempotency(small, { schema: env.schema });
  const taken = await small.connect();
  try {
    const key = unique('run-pool-timeout');
    const error = await runner.execute(scope, key, intentOf(key), writeWidget).catch((e) => e);
    assert.ok(error instanceof DatabaseUnavailableError, String(error));
    assert.equal(error.sqlstate, undefined);
  } finally {
    taken.release();
  }
});

test('class 53: too many connections for the role', async () => {
  const role = `${env.serviceRole}_limited`;
  await admin.query(`DROP ROLE IF EXISTS ${role}`);
  await admin.query(`CREATE ROLE ${role} LOGIN PASSWORD 'limited' CONNECTION LIMIT 0`);
  const url = new URL(env.serviceUrl);
  url.username = role;
  url.password = 'limited';
  const limited = servicePool('node-suite-limited', { connectionString: url.toString() });
  cleanups.push(() => limited.end());
  const key = unique('run-53');
  const error = await new Idempotency(limited, { schema: env.schema })
    .execute(scope, key, intentOf(key), writeWidget)
    .catch((e) => e);
  assert.ok(error instanceof OutOfResourcesError, String(error));
  assert.equal(error.sqlstate, '53300');
  assert.deepEqual(
    [httpAnswer(error).status, httpAnswer(error).headers['Retry-After']],
    [503, '10'],
  );
});

test('42501: a business write on a table of the schema is not allowed', async () => {
  const key = unique('run-42501');
  const error = await idempotency
    .execute(scope, key, intentOf(key), async (tx) => {
      await tx.query(`DELETE FROM ${env.schema}.idempotency_records`);
      return writeWidget(tx);
    })
    .catch((e) => e);
  assert.ok(error instanceof NotAllowedError, String(error));
  assert.equal(httpAnswer(error).status, 500);
  assert.equal(await recordsOf(key), 0);
});

test('23505 on the business id: the same request replays it, another is a conflict', async () => {
  const requestId = unique('req');
  const first = await idempotency.execute(
    scope, unique('run-biz'), intentOf(requestId), writeWidget,
  );
  assert.ok(first instanceof Completed);

  const newKey = unique('run-biz-new');
  const replay = await idempotency.execute(scope, newKey, intentOf(requestId), writeWidget, {
    businessId: widgetBusinessId,
  });
  assert.ok(replay instanceof ReplayByBusinessId, `got ${replay.kind}`);
  assert.deepEqual(
    [replay.statusCode, replay.bodyText, replay.resourceId],
    [200, first.bodyText, first.resourceId],
  );
  assert.equal(await recordsOf(newKey), 0, 'the new key is not recorded');

  const otherKey = unique('run-biz-other');
  const conflict = await idempotency.execute(
    scope, otherKey, intentOf(requestId, 'nut'), writeWidget, { businessId: widgetBusinessId },
  );
  assert.ok(conflict instanceof DuplicateBusinessId);
  assert.equal(await recordsOf(otherKey), 0);
  assert.equal(await widgetsOf(requestId), 1);

  // The object gone by the time it is read (its transaction rolled back): run it all again.
  let reads = 0;
  const flaky = {
    constraint: widgetBusinessId.constraint,
    read: async (...args) => (++reads === 1 ? null : widgetBusinessId.read(...args)),
  };
  const again = await idempotency.execute(scope, unique('run-biz-again'), intentOf(requestId),
    writeWidget, { businessId: flaky });
  assert.ok(again instanceof ReplayByBusinessId);
  assert.equal(reads, 2);
});

test('a route whose key is optional: no key, no claim', async () => {
  const requestId = unique('req-nokey');
  const done = await idempotency.execute(scope, null, intentOf(requestId), writeWidget);
  assert.ok(done instanceof Completed);
  assert.equal(done.replayDeadline, null);
  const [row] = await adminRows(
    'SELECT public.widget_body(w)::text AS body FROM public.widgets w WHERE request_id = $1',
    [requestId],
  );
  assert.equal(done.bodyText, row.body, 'jsonb\'s text, as complete would give');
  assert.equal(await widgetsOf(requestId), 1);
  // No record refuses the commit of a handler that did not complete (TS003): the runner does.
  const forgetful = unique('req-nokey-forgetful');
  const error = await idempotency
    .execute(scope, null, intentOf(forgetful), insertWidget)
    .catch((e) => e);
  assert.ok(error instanceof ClaimNotCompletedError, String(error));
  assert.equal(await widgetsOf(forgetful), 0);
});

test('api_version(): checked once per pool; another version or none is refused', async () => {
  await admin.query(`
    DROP SCHEMA IF EXISTS fake_api CASCADE;
    CREATE SCHEMA fake_api;
    CREATE FUNCTION fake_api.api_version() RETURNS integer LANGUAGE sql RETURN 2;
    GRANT USAGE ON SCHEMA fake_api TO ${env.serviceRole};`);
  const key = unique('run-version');
  const error = await new Idempotency(pool, { schema: 'fake_api' })
    .execute(scope, key, intentOf(key), writeWidget)
    .catch((e) => e);
  assert.ok(error instanceof UnknownApiVersionError, String(error));
  assert.equal(error.found, 2);
  const none = await new Idempotency(pool, { schema: 'no_such_schema' })
    .execute(scope, key, intentOf(key), writeWidget)
    .catch((e) => e);
  assert.ok(none instanceof UnknownApiVersionError, String(none));
  assert.equal(none.sqlstate, '3F000');
  assert.equal(httpAnswer(none).status, 500);
  assert.equal(await recordsOf(key), 0);

  // Once per pool: the statements a fresh runner sends over three requests.
  const sent = [];
  const watched = {
    totalCount: 0,
    async connect() {
      const client = await pool.connect();
      return {
        query: (text, values) => {
          sent.push(text);
          return client.query(text, values);
        },
        release: (destroy) => client.release(destroy),
      };
    },
  };
  const runner = new Idempotency(watched, { schema: env.schema });
  for (let i = 0; i < 3; i += 1) {
    const k = unique('run-once');
    assert.ok((await runner.execute(scope, k, intentOf(k), writeWidget)) instanceof Completed);
  }
  assert.equal(sent.filter((text) => text.includes('api_version()')).length, 1);
});

test('on a single Client, requests run one after another', async () => {
  const client = new pg.Client({
    connectionString: env.serviceUrl,
    application_name: 'node-suite-client',
  });
  await client.connect();
  cleanups.push(() => client.end());
  const runner = new Idempotency(client, { schema: env.schema });
  const keys = [unique('run-client-a'), unique('run-client-b'), unique('run-client-c')];
  const results = await Promise.all(
    keys.map((k) => runner.execute(scope, k, intentOf(k), writeWidget)),
  );
  assert.ok(results.every((r) => r instanceof Completed));
  const replay = await runner.execute(scope, keys[0], intentOf(keys[0]), writeWidget);
  assert.equal(replay.bodyText, results[0].bodyText);
});
