/**
 * The errors of the SQL API, one class per SQLSTATE (docs/api.md, "SQLSTATEs"), all under
 * {@link TombstonedError}, and {@link classify}: the one place a driver error becomes one of them.
 * Classification is by SQLSTATE (`err.code` of a node-postgres `DatabaseError`), never by text.
 */

/** Where an error came from, which decides what a lost connection means. */
export interface ClassifyContext {
  /**
   * The COMMIT was sent: a connection lost now (class 08, 57P01-03, or no answer at all) may
   * have committed, so it is {@link OutcomeUnknownError}, never "failed".
   */
  atCommit?: boolean;
  /**
   * The error came from a statement this package sent (or from the pool): one without a SQLSTATE
   * is the driver losing its connection. Errors of the caller's own code are left as they are.
   */
  fromDriver?: boolean;
}

/** The base of every error this package throws. */
export class TombstonedError extends Error {
  /** The SQLSTATE the error was classified from; undefined when it had none. */
  readonly sqlstate: string | undefined;
  /**
   * Seconds a client should wait before retrying with the same key (the answer's `Retry-After`),
   * where retrying helps; undefined where it does not.
   */
  readonly retryAfter: number | undefined = undefined;

  constructor(message: string, options: { sqlstate?: string | undefined; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.sqlstate = options.sqlstate;
  }
}

/** 55P03: the key's owner is still in flight after `lock_timeout`. Retry with the same key. */
export class InProgressError extends TombstonedError {
  override readonly retryAfter: number = 1;
}

/** 22023: an argument the SQL API refused (the message names it); nothing was written. */
export class InvalidArgumentError extends TombstonedError {
  /** The argument's name, from the message `invalid argument <name>: ...` (for display only). */
  readonly argument: string | undefined;

  constructor(message: string, options: { sqlstate?: string; cause?: unknown } = {}) {
    super(message, options);
    this.argument = /^invalid argument (\S+):/.exec(message)?.[1];
  }
}

/** TS002: `complete` in a transaction that holds no unfinished claim of the key. */
export class NotClaimedError extends TombstonedError {}

/** TS003: COMMIT of a transaction whose claim was never completed; all of it rolled back. */
export class ClaimNotCompletedError extends TombstonedError {}

/** TS004: a second `claim` of one key in one transaction before `complete`. */
export class ClaimedTwiceError extends TombstonedError {}

/** TS005: a function that runs only under READ COMMITTED was called under another level. */
export class WrongIsolationError extends TombstonedError {}

/** 40001 / 40P01: the transaction must run again (the runner does, a bounded number of times). */
export class SerializationFailureError extends TombstonedError {
  override readonly retryAfter: number = 1;
}

/** 40001 / 40P01 on every attempt the runner made. */
export class RetriesExhaustedError extends TombstonedError {
  override readonly retryAfter: number = 1;
  /** How many times the transaction ran. */
  readonly attempts: number;

  constructor(message: string, options: { attempts: number; sqlstate?: string; cause?: unknown }) {
    super(message, options);
    this.attempts = options.attempts;
  }
}

/** 25006: a read-only transaction or server (a standby, mid-failover). Nothing was done. */
export class ReadOnlyError extends TombstonedError {
  override readonly retryAfter: number = 2;
}

/** The connection was lost after COMMIT was sent: the request may have been done. */
export class OutcomeUnknownError extends TombstonedError {
  override readonly retryAfter: number = 1;
}

/** The database could not be reached, or the connection was lost before COMMIT was sent. */
export class DatabaseUnavailableError extends TombstonedError {
  override readonly retryAfter: number = 2;
}

/** SQLSTATE class 53 (disk full, out of memory, too many connections). Nothing was done. */
export class OutOfResourcesError extends TombstonedError {
  override readonly retryAfter: number = 10;
}

/** 42501: the role lacks a privilege (a table of the schema, an operation it was not granted). */
export class NotAllowedError extends TombstonedError {}

/** The schema's `api_version()` is not the one this package speaks (or there is none). */
export class UnknownApiVersionError extends TombstonedError {
  /** What the schema answered; undefined when it has no `api_version()`. */
  readonly found: number | undefined;

  constructor(
    message: string,
    options: { found?: number; sqlstate?: string; cause?: unknown } = {},
  ) {
    super(message, options);
    this.found = options.found;
  }
}

/** The `Idempotency-Key` header is missing (on a route that needs it), repeated or malformed. */
export class InvalidIdempotencyKeyError extends TombstonedError {}

/**
 * The request was refused before any transaction (the route's `caller` or `intent` threw it): it
 * consumes no key. Answered as an RFC 9457 problem of the given status and name.
 */
export class InvalidRequestError extends TombstonedError {
  /** The HTTP status (a 4xx). */
  readonly status: number;
  /** The problem's name: its `type` is the tombstoned problem prefix followed by it. */
  readonly problem: string;
  /** The problem's title, fixed per problem name. */
  readonly title: string;
  /** Extension members of the problem document. */
  readonly members: Record<string, unknown>;
  /** Headers of the answer (a 401's `WWW-Authenticate`). */
  readonly headers: Record<string, string>;

  constructor(
    detail: string,
    options: {
      status?: number;
      problem?: string;
      title?: string;
      members?: Record<string, unknown>;
      headers?: Record<string, string>;
    } = {},
  ) {
    super(detail);
    this.status = options.status ?? 400;
    this.problem = options.problem ?? 'validation-failed';
    this.title = options.title ?? 'One or more fields are invalid';
    this.members = options.members ?? {};
    this.headers = options.headers ?? {};
  }
}

/**
 * The SQLSTATE of a node-postgres `DatabaseError` (which carries the server's `severity` and
 * `code`); undefined for anything else — a system error's `ECONNRESET` is not a SQLSTATE.
 */
export function sqlstateOf(error: unknown): string | undefined {
  if (typeof error !== 'object' || error === null) return undefined;
  const { code, severity } = error as { code?: unknown; severity?: unknown };
  return typeof code === 'string' && typeof severity === 'string' && /^[0-9A-Z]{5}$/.test(code)
    ? code
    : undefined;
}

/** SQLSTATEs of a server that ended or refused the session (57P01-03). */
const SERVER_GONE = new Set(['57P01', '57P02', '57P03']);

/**
 * The error of the SQL API that `error` is, or `error` itself when it is none (a unique
 * violation of the caller's table, the caller's own exception).
 */
export function classify(error: unknown, context: ClassifyContext = {}): unknown {
  if (error instanceof TombstonedError) return error;
  const sqlstate = sqlstateOf(error);
  const message = error instanceof Error ? error.message : String(error);
  const options = { sqlstate, cause: error };
  const lost =
    sqlstate === undefined
      ? context.fromDriver === true || context.atCommit === true
      : sqlstate.startsWith('08') || SERVER_GONE.has(sqlstate);
  if (lost) {
    return context.atCommit
      ? new OutcomeUnknownError(
          `the connection failed after COMMIT was sent, the outcome is unknown: ${message}`,
          options,
        )
      : new DatabaseUnavailableError(`the database is unavailable: ${message}`, options);
  }
  switch (sqlstate) {
    case undefined:
      return error;
    case '55P03':
      return new InProgressError(message, options);
    case '22023':
      return new InvalidArgumentError(message, options);
    case 'TS002':
      return new NotClaimedError(message, options);
    case 'TS003':
      return new ClaimNotCompletedError(message, options);
    case 'TS004':
      return new ClaimedTwiceError(message, options);
    case 'TS005':
      return new WrongIsolationError(message, options);
    case '40001':
    case '40P01':
      return new SerializationFailureError(message, options);
    case '25006':
      return new ReadOnlyError(message, options);
    case '42501':
      return new NotAllowedError(message, options);
    case '57014':
      // Cancelled (statement_timeout, a cancel request): rolled back, nothing was done.
      return new DatabaseUnavailableError(message, options);
    default:
      return sqlstate.startsWith('53') ? new OutOfResourcesError(message, options) : error;
  }
}

/** Whether a pooled connection that saw `error` should be discarded rather than reused. */
export function discardsConnection(error: unknown): boolean {
  // A read-only server is evicted too: a new connection may reach the new primary.
  return (
    error instanceof DatabaseUnavailableError ||
    error instanceof OutcomeUnknownError ||
    error instanceof ReadOnlyError
  );
}
