// What every test file shares: the environment tests/it/clients_support.rs gives the suite, pools
// of the service role and of the admin, the service's own table (the one fixture that sets the
// role up), barriers on pg_stat_activity, the daemon's real cleaner, and a session that holds a
// key in an open transaction.
import { execFile, execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { setTimeout as delay } from 'node:timers/promises';
import { promisify } from 'node:util';

import pg from 'pg';

import { claim, complete } from '@tombstoned/client';

function required(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run this suite through tests/it/clients_node.rs`);
  }
  return value;
}

/** The variables tests/it/clients_support.rs documents. */
export const env = {
  bin: required('TOMBSTONED_BIN'),
  config: required('TOMBSTONED_TEST_CONFIG'),
  adminUrl: required('TOMBSTONED_TEST_ADMIN_URL'),
  serviceUrl: required('TOMBSTONED_TEST_SERVICE_URL'),
  serviceRole: required('TOMBSTONED_TEST_SERVICE_ROLE'),
  schema: required('TOMBSTONED_TEST_SCHEMA'),
};

/** The operation every route and core call of the suite uses. */
export const OPERATION = 'create-widget';

/** An operation no role of the suite holds: a call in it is refused (42501). */
export const NOT_GRANTED = 'refund-widget';

/** How long a barrier waits for what it expects before the test fails. */
export const PATIENCE_MS = 20_000;

/** A key (or any id) no other test uses. */
export const unique = (prefix) => `${prefix}-${randomUUID()}`;

/** A pool of the service role whose sessions carry `applicationName` (barriers look for it). */
export function servicePool(applicationName, options = {}) {
  const pool = new pg.Pool({
    connectionString: env.serviceUrl,
    application_name: applicationName,
    max: 8,
    ...options,
  });
  pool.on('error', () => {}); // an idle connection a test broke on purpose
  return pool;
}

/** The migrating role: inspects rows, moves deadlines, creates what the service role may not. */
export const admin = new pg.Pool({
  connectionString: env.adminUrl,
  application_name: 'node-suite-admin',
  max: 4,
});
admin.on('error', () => {});

/** The rows of `sql` as the admin. */
export async function adminRows(sql, values = []) {
  return (await admin.query(sql, values)).rows;
}

/**
 * What a service role of the suite gets, in one place: the README's two GRANTs and `operation`,
 * granted through the daemon's own command (docs/api.md, Privileges); null grants it none.
 * Repeating it changes nothing.
 */
export async function setUpRole(role, operation) {
  await admin.query(`GRANT USAGE ON SCHEMA ${env.schema} TO ${role};
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA ${env.schema} TO ${role}`);
  if (operation !== null) {
    execFileSync(env.bin, ['--config', env.config, 'operations', 'grant', operation, role],
      { stdio: 'pipe' });
  }
}

/**
 * The service role's set-up (`setUpRole`), its table `widgets` (the business id
 * `widgets_request_id_key` is the second line of defence) and `widget_body()`, the one place the
 * answer's JSON is built. Made by the admin and given to the role, as examples/README.md does.
 * Idempotent: each test file calls it.
 */
export async function prepareService() {
  await admin.query(`
    CREATE TABLE IF NOT EXISTS public.widgets (
        widget_id    uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
        tenant_id    text        NOT NULL,
        principal_id text        NOT NULL,
        request_id   text        NOT NULL,
        name         text        NOT NULL,
        created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
        CONSTRAINT widgets_request_id_key UNIQUE (tenant_id, request_id)
    );
    CREATE OR REPLACE FUNCTION public.widget_body(w public.widgets) RETURNS jsonb
        LANGUAGE sql STABLE
        RETURN jsonb_build_object('widget_id', w.widget_id, 'request_id', w.request_id,
                                  'name', w.name, 'created_at', w.created_at);
    ALTER TABLE public.widgets OWNER TO ${env.serviceRole};
    ALTER FUNCTION public.widget_body(public.widgets) OWNER TO ${env.serviceRole};`);
  await setUpRole(env.serviceRole, OPERATION);
  // The first claim of a scope makes the scope's row inside its own transaction: concurrent
  // first claims would wait for each other. The tests' scope is made here, once.
  const client = new pg.Client({ connectionString: env.serviceUrl });
  await client.connect();
  try {
    const scope = { tenant: 'acme', principal: 'billing', operation: OPERATION };
    const key = unique('scope');
    await client.query('BEGIN ISOLATION LEVEL READ COMMITTED');
    await claim(client, scope, key, { v: 0 }, '1 hour', '2 seconds', { schema: env.schema });
    await complete(client, scope, key, 200, {}, null, { schema: env.schema });
    await client.query('COMMIT');
  } finally {
    await client.end();
  }
}

/**
 * Waits until a session of `applicationName` waits on a lock (a claim behind the key's owner);
 * its pid. Polls pg_stat_activity: the barrier is what PostgreSQL reports, not the passing of
 * time.
 */
export async function waitForLockWait(applicationName) {
  const deadline = Date.now() + PATIENCE_MS;
  for (;;) {
    const rows = await adminRows(
      `SELECT pid FROM pg_stat_activity
        WHERE application_name = $1 AND wait_event_type = 'Lock' AND datname = current_database()`,
      [applicationName],
    );
    if (rows.length > 0) return rows[0].pid;
    if (Date.now() > deadline) {
      throw new Error(`no session of ${applicationName} waited on a lock within ${PATIENCE_MS} ms`);
    }
    await delay(5);
  }
}

/** Moves the replay deadline of `key` into the past (the window is over). */
export async function expireKey(key) {
  const rows = await adminRows(
    `UPDATE ${env.schema}.idempotency_records
        SET replay_deadline = clock_timestamp() - interval '1 second'
      WHERE idempotency_key = $1 RETURNING 1`,
    [key],
  );
  if (rows.length !== 1) throw new Error(`no record of key ${key}`);
}

/** One run of the daemon's real cleaner (`tombstoned cleanup`); its JSON report. */
export async function runCleaner() {
  const { stdout } = await promisify(execFile)(
    env.bin,
    ['cleanup', '--config', env.config, '--json'],
    { env: { ...process.env, RUST_LOG: 'warn' } },
  );
  return JSON.parse(stdout);
}

/** Whether the record of `key` is a tombstone (expired, its body gone). */
export async function isTombstone(key) {
  const rows = await adminRows(
    `SELECT expired AND response_body IS NULL AS tombstone FROM ${env.schema}.idempotency_records
      WHERE idempotency_key = $1`,
    [key],
  );
  return rows[0]?.tombstone === true;
}

/** How many records `key` has (a refused or rolled-back request leaves none). */
export async function recordsOf(key) {
  const rows = await adminRows(
    `SELECT count(*)::int AS n FROM ${env.schema}.idempotency_records
      WHERE idempotency_key = $1`,
    [key],
  );
  return rows[0].n;
}

/** How many widgets carry `requestId`. */
export async function widgetsOf(requestId) {
  const rows = await adminRows(
    'SELECT count(*)::int AS n FROM public.widgets WHERE request_id = $1',
    [requestId],
  );
  return rows[0].n;
}

/**
 * A session of the admin that owns a key in an open transaction: an in-flight request of
 * another process.
 */
export class Holder {
  static async claim(scope, key, intent) {
    const client = await admin.connect();
    await client.query('BEGIN');
    const { rows } = await client.query(
      `SELECT outcome FROM ${env.schema}.claim($1, $2, $3, $4,
                  ${env.schema}.fingerprint($5::jsonb), '1 hour', '2 seconds')`,
      [scope.tenant, scope.principal, scope.operation, key, JSON.stringify(intent)],
    );
    if (rows[0].outcome !== 'owner') throw new Error(`the holder got ${rows[0].outcome}`);
    return new Holder(client, scope, key);
  }

  constructor(client, scope, key) {
    this.client = client;
    this.scope = scope;
    this.key = key;
  }

  /** Completes the key with `body`; the stored text. */
  async complete(body) {
    const { rows } = await this.client.query(
      `SELECT ${env.schema}.complete($1, $2, $3, $4, 201, $5::jsonb, 'held') AS body`,
      [this.scope.tenant, this.scope.principal, this.scope.operation, this.key,
        JSON.stringify(body)],
    );
    return rows[0].body;
  }

  async end(sql) {
    try {
      await this.client.query(sql);
    } finally {
      this.client.release();
    }
  }
}

/** A promise with its resolve function, to hold a handler at a point the test chooses. */
export function gate() {
  let open;
  const opened = new Promise((resolve) => {
    open = resolve;
  });
  return { opened, open };
}
