/**
 * The SQL API's functions, each called inside the caller's transaction on a node-postgres
 * `Client` or `PoolClient`: `claim`, `complete`, `enqueueEvent`, `lookup`, and the
 * `api_version()` check. Every statement is parameterised; the fingerprint is computed by the
 * server (`fingerprint($intent::jsonb)`), never here, so no client can drift from another.
 */

import { classify, sqlstateOf, UnknownApiVersionError } from './errors.js';
import { Expired, KeyReused, Owner, Replay } from './outcomes.js';
import type { ClaimOutcome, LookupOutcome } from './outcomes.js';
import { currentTraceparent, SET_TRACEPARENT } from './trace.js';

/** The `api_version()` this package speaks. */
export const API_VERSION = 1;

/** The schema `tombstoned migrate` installs the functions in, unless configured otherwise. */
export const DEFAULT_SCHEMA = 'tombstoned';

/** How long a claim waits for an in-flight owner of its key by default (the function's own). */
export const DEFAULT_LOCK_TIMEOUT = '2 seconds';

/** How long a key replays its answer, unless the runner is told otherwise. */
export const DEFAULT_REPLAY_WINDOW = '24 hours';

/** What a query answers; node-postgres's `QueryResult` is one. */
export interface QueryResultLike {
  rows: any[];
  rowCount?: number | null;
}

/** A connection to run statements on: a node-postgres `Client` or `PoolClient`. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<QueryResultLike>;
}

/** Who asks: from the service's own authentication, never from the request body. */
export interface Caller {
  tenant: string;
  principal: string;
}

/** Who asks for what: the scope of a key (the same key in two scopes names two records). */
export interface Scope extends Caller {
  operation: string;
}

/** A PostgreSQL interval (`'24 hours'`), or a number of milliseconds. */
export type Interval = string | number;

/** Where the functions live (`database.schema` of the daemon's configuration). */
export interface SchemaOption {
  /** Default `tombstoned`. */
  schema?: string;
}

/** The statements of one schema, its name quoted as an identifier. */
interface Statements {
  apiVersion: string;
  claim: string;
  complete: string;
  lookup: string;
  enqueueEvent: string;
}

const statementsBySchema = new Map<string, Statements>();

function statements(options: SchemaOption | undefined): Statements {
  const schema = options?.schema ?? DEFAULT_SCHEMA;
  let found = statementsBySchema.get(schema);
  if (found === undefined) {
    const s = `"${schema.replaceAll('"', '""')}"`;
    const columns = 'outcome, status_code, response_body, resource_id, replay_deadline, expired_at';
    found = {
      apiVersion: `SELECT ${s}.api_version() AS version`,
      claim: `SELECT ${columns} FROM ${s}.claim($1, $2, $3, $4, ${s}.fingerprint($5::jsonb),
                                                  $6::interval, $7::interval)`,
      complete: `SELECT ${s}.complete($1, $2, $3, $4, $5, $6::jsonb, $7) AS body`,
      lookup: `SELECT ${columns} FROM ${s}.lookup($1, $2, $3, $4, ${s}.fingerprint($5::jsonb))`,
      enqueueEvent: `SELECT ${s}.enqueue_event($1, $2, $3, $4::jsonb)::text AS id`,
    };
    statementsBySchema.set(schema, found);
  }
  return found;
}

/** An interval as PostgreSQL reads it. */
export function intervalText(value: Interval): string {
  return typeof value === 'number' ? `${value} milliseconds` : value;
}

/** JSON text of a value for a `jsonb` parameter (undefined stays NULL: the API refuses it). */
function jsonText(value: unknown): string | null {
  return value === undefined ? null : JSON.stringify(value);
}

/** Runs one of this package's statements, its errors classified. */
async function run(conn: Queryable, text: string, values: unknown[]): Promise<any[]> {
  try {
    return (await conn.query(text, values)).rows;
  } catch (error) {
    throw classify(error, { fromDriver: true });
  }
}

function outcomeOf(row: any): ClaimOutcome {
  switch (row.outcome) {
    case 'owner':
      return new Owner(row.replay_deadline);
    case 'replay':
      return new Replay(row.status_code, row.response_body, row.resource_id, row.replay_deadline);
    case 'key_reused':
      return new KeyReused();
    case 'expired':
      return new Expired(row.resource_id, row.replay_deadline, row.expired_at);
    default:
      throw new UnknownApiVersionError(
        `the SQL API answered an outcome this package does not know: ${row.outcome}`,
      );
  }
}

/**
 * `api_version()` of the schema, refused with {@link UnknownApiVersionError} unless it is
 * {@link API_VERSION} (also when the schema has no such function: not migrated).
 */
export async function checkApiVersion(conn: Queryable, options?: SchemaOption): Promise<number> {
  const schema = options?.schema ?? DEFAULT_SCHEMA;
  let rows;
  try {
    rows = await run(conn, statements(options).apiVersion, []);
  } catch (error) {
    const sqlstate = sqlstateOf(error);
    // 3F000: no such schema; 42883: no such function. Not migrated, or another schema.
    if (sqlstate === '3F000' || sqlstate === '42883') {
      throw new UnknownApiVersionError(
        `schema ${schema} has no api_version(): not migrated by \`tombstoned migrate\`, ` +
          `or another schema (this package speaks API version ${API_VERSION})`,
        { sqlstate, cause: error },
      );
    }
    throw error;
  }
  const version = Number(rows[0]?.version);
  if (version !== API_VERSION) {
    throw new UnknownApiVersionError(
      `schema ${schema} speaks API version ${version}; this package speaks version ` +
        `${API_VERSION} only`,
      { found: version },
    );
  }
  return version;
}

/**
 * Claims `key` in `scope` for `intent` inside the caller's READ COMMITTED transaction. Only
 * {@link Owner} may write; every other outcome is answered from the row, and the transaction
 * committed right away (a replay holds a share lock the cleaner waits for).
 */
export async function claim(
  conn: Queryable,
  scope: Scope,
  key: string,
  intent: unknown,
  replayWindow: Interval,
  lockTimeout: Interval = DEFAULT_LOCK_TIMEOUT,
  options?: SchemaOption,
): Promise<ClaimOutcome> {
  const rows = await run(conn, statements(options).claim, [
    scope.tenant,
    scope.principal,
    scope.operation,
    key,
    jsonText(intent),
    intervalText(replayWindow),
    intervalText(lockTimeout),
  ]);
  return outcomeOf(rows[0]);
}

/**
 * Stores the owner's answer on the key this transaction claimed; returns the body as every
 * replay will send it (jsonb's text): send that, not your own serialisation.
 */
export async function complete(
  conn: Queryable,
  scope: Scope,
  key: string,
  statusCode: number,
  body: unknown,
  resourceId: string | null = null,
  options?: SchemaOption,
): Promise<string> {
  const rows = await run(conn, statements(options).complete, [
    scope.tenant,
    scope.principal,
    scope.operation,
    key,
    statusCode,
    jsonText(body),
    resourceId,
  ]);
  return rows[0].body;
}

/**
 * An outbox event that commits with the caller's transaction or not at all; its id. With the
 * OpenTelemetry API installed and a span active, the event keeps that span's trace context: its
 * delivery continues the trace.
 */
export async function enqueueEvent(
  conn: Queryable,
  tenant: string,
  aggregateId: string,
  eventType: string,
  payload: unknown,
  options?: SchemaOption,
): Promise<string> {
  const traceparent = await currentTraceparent();
  if (traceparent !== null) {
    await run(conn, SET_TRACEPARENT, [traceparent]);
  }
  const rows = await run(conn, statements(options).enqueueEvent, [
    tenant,
    aggregateId,
    eventType,
    jsonText(payload),
  ]);
  return rows[0].id;
}

/**
 * jsonb's text of `body`: what `complete` would have stored, for the owner's answer of a route
 * whose key is optional and absent (no record to store it on).
 */
export async function jsonbText(conn: Queryable, body: unknown): Promise<string> {
  const rows = await run(conn, 'SELECT $1::jsonb::text AS body', [jsonText(body)]);
  return rows[0].body;
}

/** What `claim` would answer for a committed record of the key, claiming nothing; null if none. */
export async function lookup(
  conn: Queryable,
  scope: Scope,
  key: string,
  intent: unknown,
  options?: SchemaOption,
): Promise<LookupOutcome | null> {
  const rows = await run(conn, statements(options).lookup, [
    scope.tenant,
    scope.principal,
    scope.operation,
    key,
    jsonText(intent),
  ]);
  return rows.length === 0 ? null : (outcomeOf(rows[0]) as LookupOutcome);
}
