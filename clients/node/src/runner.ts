/**
 * The transaction runner, {@link Idempotency}: one READ COMMITTED transaction per attempt that
 * claims the key, runs the caller's business write only when it owns it, completes and commits;
 * retries the whole transaction on 40001/40P01 (bounded), answers a unique violation of the
 * business id from the existing object, and never calls a lost COMMIT "failed".
 */

import {
  checkApiVersion,
  claim,
  complete,
  DEFAULT_LOCK_TIMEOUT,
  DEFAULT_REPLAY_WINDOW,
  DEFAULT_SCHEMA,
  enqueueEvent,
  jsonbText,
} from './core.js';
import type { Interval, Queryable, QueryResultLike, Scope } from './core.js';
import {
  ClaimNotCompletedError,
  classify,
  DatabaseUnavailableError,
  discardsConnection,
  RetriesExhaustedError,
  SerializationFailureError,
  sqlstateOf,
  TombstonedError,
} from './errors.js';
import { Completed, DuplicateBusinessId, ReplayByBusinessId } from './outcomes.js';
import type { ExecuteOutcome } from './outcomes.js';

/** A single connection; node-postgres's `Client` (connected) is one. */
export interface ClientLike extends Queryable {
  /** node-postgres's clients are event emitters (a lost connection is an 'error' event). */
  on?(event: 'error', listener: (error: Error) => void): unknown;
  off?(event: 'error', listener: (error: Error) => void): unknown;
}

/** A connection taken from a pool; node-postgres's `PoolClient` is one. */
export interface PoolClientLike extends ClientLike {
  /** Back to the pool; with an error (or `true`), the connection is closed instead. */
  release(destroy?: Error | boolean): void;
}

/** A pool of connections; node-postgres's `Pool` is one. */
export interface PoolLike {
  connect(): Promise<PoolClientLike>;
  /** How many connections the pool holds (tells a `Pool` from a `Client`). */
  readonly totalCount: number;
}

/** How many times a transaction runs on 40001/40P01 before `RetriesExhaustedError`. */
export const DEFAULT_ATTEMPTS = 3;

/** The runner's settings. */
export interface IdempotencyOptions {
  /** The schema `tombstoned migrate` installed the functions in. Default `tombstoned`. */
  schema?: string;
  /** How long a key replays its answer. Default `24 hours`. */
  replayWindow?: Interval;
  /** How long a claim waits for an in-flight owner of the key. Default `2 seconds`. */
  lockTimeout?: Interval;
  /** How many times a transaction runs on 40001/40P01 before `RetriesExhaustedError`. Default 3. */
  attempts?: number;
}

/** The business write's view of the transaction it runs in. */
export interface Transaction<I> {
  /** The connection, inside the transaction (read committed). */
  readonly client: Queryable;
  readonly scope: Scope;
  /** Null on a route whose key is optional and was not sent. */
  readonly key: string | null;
  readonly intent: I;
  /** When the key's replay window ends (null without a key). */
  readonly replayDeadline: Date | null;
  /** A statement on the transaction's connection. */
  query(text: string, values?: unknown[]): Promise<QueryResultLike>;
  /** An outbox event of the scope's tenant, committed with the business write or not at all. */
  enqueueEvent(aggregateId: string, eventType: string, payload: unknown): Promise<string>;
  /**
   * Stores the answer on the key's record (`complete`) and returns it: the runner sends exactly
   * its text, which every replay sends too. `statusCode` 200-499 (a 4xx business rejection is
   * an outcome too, replayed like a success); `body` any JSON value, stored as jsonb (so the
   * text is jsonb's); `resourceId` the business object the key produced (kept in the tombstone,
   * and in `Location`).
   */
  complete(statusCode: number, body: unknown, resourceId?: string | null): Promise<Completed>;
}

/**
 * The business write, run only when the transaction owns the key: it returns
 * `tx.complete(...)`. A handler that returns without completing leaves the claim uncompleted,
 * and the database refuses the COMMIT (TS003, `ClaimNotCompletedError`): nothing of the
 * transaction remains.
 */
export type Handler<I> = (tx: Transaction<I>) => Promise<Completed | undefined | void>;

/** The existing object found for a business id that was already taken. */
export interface BusinessRecord {
  /** Whether it is this caller's same request (same principal, same parameters). */
  same: boolean;
  /** Its answer text: the bytes its own key replays. */
  bodyText: string;
  resourceId: string | null;
}

/**
 * The second line of defence: a unique violation (23505) of `constraint` in the business write
 * means the request already has an object, made under another key. The transaction rolls back
 * (the new key is not recorded), `read` looks the object up in a new transaction: the same
 * request gets it as a replay (200, as the endpoint answers: this request created nothing),
 * anything else a conflict. `read` answering null (the object's own transaction rolled back
 * meanwhile) runs the whole transaction again.
 */
export interface BusinessId<I> {
  /** The name of the business id's unique constraint. */
  constraint: string;
  read(client: Queryable, scope: Scope, intent: I): Promise<BusinessRecord | null>;
}

/** Per-call settings of {@link Idempotency.execute}. */
export interface ExecuteOptions<I> {
  replayWindow?: Interval;
  lockTimeout?: Interval;
  businessId?: BusinessId<I>;
}

/** The business read answered null: run the whole transaction again. */
const AGAIN = Symbol('again');

/**
 * Runs requests under the protocol on a node-postgres `Pool` (a connection per call) or a
 * connected `Client` (calls one after another). Checks the schema's `api_version()` once.
 */
export class Idempotency {
  readonly #pool: PoolLike | undefined;
  readonly #client: ClientLike | undefined;
  readonly #schema: string;
  readonly #replayWindow: Interval;
  readonly #lockTimeout: Interval;
  readonly #attempts: number;
  /** Calls on a single `Client` wait for the one before. */
  #queue: Promise<unknown> = Promise.resolve();
  #versionChecked: Promise<number> | undefined;

  constructor(source: PoolLike | ClientLike, options: IdempotencyOptions = {}) {
    if ('totalCount' in source) this.#pool = source;
    else this.#client = source;
    this.#schema = options.schema ?? DEFAULT_SCHEMA;
    this.#replayWindow = options.replayWindow ?? DEFAULT_REPLAY_WINDOW;
    this.#lockTimeout = options.lockTimeout ?? DEFAULT_LOCK_TIMEOUT;
    this.#attempts = options.attempts ?? DEFAULT_ATTEMPTS;
    if (!Number.isInteger(this.#attempts) || this.#attempts < 1) {
      throw new RangeError(`attempts must be a positive integer, not ${options.attempts}`);
    }
  }

  /**
   * Claims `key` in `scope` for `intent` (normalised: only what changes the business result),
   * runs `handler` only when this request owns the key, completes and commits. Replays,
   * key reuse and expiry commit at once and come back as they are. A null `key` (a route whose
   * key is optional) runs `handler` in a transaction without a claim.
   *
   * Throws a `TombstonedError` for every failure of the protocol (`InProgressError`,
   * `OutcomeUnknownError`, ...), and the handler's own errors as they are — after rolling back.
   */
  async execute<I>(
    scope: Scope,
    key: string | null,
    intent: I,
    handler: Handler<I>,
    options: ExecuteOptions<I> = {},
  ): Promise<ExecuteOutcome> {
    return this.#withConnection(async (client) => {
      let last: unknown;
      for (let attempt = 1; attempt <= this.#attempts; attempt += 1) {
        try {
          const outcome = await this.#attempt(client, scope, key, intent, handler, options);
          if (outcome !== AGAIN) return outcome;
        } catch (error) {
          if (!(error instanceof SerializationFailureError)) throw error;
          last = error;
        }
      }
      throw new RetriesExhaustedError(
        `the transaction had to run again on each of its ${this.#attempts} attempts`,
        {
          attempts: this.#attempts,
          sqlstate: (last as TombstonedError | undefined)?.sqlstate,
          cause: last,
        },
      );
    });
  }

  /** One attempt: the claiming transaction, then the business-id read if it needs one. */
  async #attempt<I>(
    client: Queryable,
    scope: Scope,
    key: string | null,
    intent: I,
    handler: Handler<I>,
    options: ExecuteOptions<I>,
  ): Promise<ExecuteOutcome | typeof AGAIN> {
    try {
      return await this.#transaction(client, async () => {
        let deadline: Date | null = null;
        if (key !== null) {
          const replayWindow = options.replayWindow ?? this.#replayWindow;
          const lockTimeout = options.lockTimeout ?? this.#lockTimeout;
          const schema = { schema: this.#schema };
          const outcome = await claim(client, scope, key, intent, replayWindow, lockTimeout,
            schema);
          if (outcome.kind !== 'owner') return outcome;
          deadline = outcome.replayDeadline;
        }
        const tx = this.#transactionFor(client, scope, key, intent, deadline);
        await handler(tx);
        const completed = tx.completed();
        // No record refuses the COMMIT of a handler that did not complete without a key: here.
        if (completed === undefined && key === null) {
          throw new ClaimNotCompletedError('the handler returned without tx.complete()');
        }
        // Without completion the claim stays uncompleted: the COMMIT below is refused (TS003).
        return completed;
      });
    } catch (error) {
      const hook = options.businessId;
      if (
        hook !== undefined &&
        sqlstateOf(error) === '23505' &&
        (error as { constraint?: unknown }).constraint === hook.constraint
      ) {
        return this.#byBusinessId(client, scope, intent, hook);
      }
      throw error;
    }
  }

  /** The object that holds the business id, read in a transaction of its own. */
  async #byBusinessId<I>(
    client: Queryable,
    scope: Scope,
    intent: I,
    hook: BusinessId<I>,
  ): Promise<ExecuteOutcome | typeof AGAIN> {
    const found = await this.#transaction(client, () => hook.read(client, scope, intent));
    if (found === null) return AGAIN;
    if (!found.same) return new DuplicateBusinessId();
    return new ReplayByBusinessId(200, found.bodyText, found.resourceId);
  }

  /**
   * `work` in one READ COMMITTED transaction. Before COMMIT is sent, any error rolls back; a
   * ROLLBACK that fails means the connection is gone with nothing committed. After it, a lost
   * connection is an unknown outcome.
   */
  async #transaction<T>(client: Queryable, work: () => Promise<T | undefined>): Promise<T> {
    await this.#begin(client);
    let value: T | undefined;
    try {
      value = await work();
    } catch (error) {
      const classified = classify(error);
      try {
        await client.query('ROLLBACK');
      } catch {
        if (classified instanceof DatabaseUnavailableError) throw classified;
        throw new DatabaseUnavailableError(
          'the connection was lost before COMMIT was sent: nothing was committed',
          { sqlstate: sqlstateOf(error), cause: error },
        );
      }
      throw classified;
    }
    try {
      await client.query('COMMIT');
    } catch (error) {
      throw classify(error, { atCommit: true });
    }
    if (value === undefined) {
      // Only a claim without its completion ends here, and its COMMIT cannot succeed (TS003).
      throw new TombstonedError('the handler returned no completion, yet the COMMIT succeeded');
    }
    return value;
  }

  /**
   * Where every transaction of the runner starts. (Issue 40 will set the request's trace
   * context here, `tombstoned.traceparent`, as the transaction's first statement.)
   */
  async #begin(client: Queryable): Promise<void> {
    try {
      await client.query('BEGIN ISOLATION LEVEL READ COMMITTED');
    } catch (error) {
      throw classify(error, { fromDriver: true });
    }
  }

  /** The owner's transaction as its handler sees it, and what its `complete` stored. */
  #transactionFor<I>(
    client: Queryable,
    scope: Scope,
    key: string | null,
    intent: I,
    replayDeadline: Date | null,
  ): Transaction<I> & { completed(): Completed | undefined } {
    const schema = { schema: this.#schema };
    let completed: Completed | undefined;
    return {
      client,
      scope,
      key,
      intent,
      replayDeadline,
      query: (text, values) => client.query(text, values),
      enqueueEvent: (aggregateId, eventType, payload) =>
        enqueueEvent(client, scope.tenant, aggregateId, eventType, payload, schema),
      complete: async (statusCode, body, resourceId = null) => {
        const text =
          key === null
            ? await jsonbText(client, body)
            : await complete(client, scope, key, statusCode, body, resourceId, schema);
        completed = new Completed(statusCode, text, resourceId, replayDeadline);
        return completed;
      },
      completed: () => completed,
    };
  }

  /** `work` on a connection of the pool (or the client), the API version checked once. */
  async #withConnection<T>(work: (client: Queryable) => Promise<T>): Promise<T> {
    if (this.#pool === undefined) {
      const client = this.#client as ClientLike;
      const turn = this.#queue.then(() => this.#checkedAndListened(client, work));
      this.#queue = turn.catch(() => undefined);
      return turn;
    }
    let client: PoolClientLike;
    try {
      client = await this.#pool.connect();
    } catch (error) {
      throw classify(error, { fromDriver: true });
    }
    let failure: unknown;
    try {
      return await this.#checkedAndListened(client, work);
    } catch (error) {
      failure = error;
      throw error;
    } finally {
      // A connection that failed (or met a read-only server) is closed, not reused.
      client.release(discardsConnection(failure) ? (failure as Error) : undefined);
    }
  }

  /**
   * `work` after the version check. node-postgres also emits a lost connection as an 'error'
   * event of the client, which a checked-out client has no listener for (the process would
   * crash): while `work` runs, the failed statement reports it instead.
   */
  async #checkedAndListened<T>(
    client: ClientLike,
    work: (client: Queryable) => Promise<T>,
  ): Promise<T> {
    const ignore = () => {};
    client.on?.('error', ignore);
    try {
      await this.#checkVersion(client);
      return await work(client);
    } finally {
      client.off?.('error', ignore);
    }
  }

  /** `api_version()` once per pool (or client); a failure is retried by the next call. */
  async #checkVersion(client: Queryable): Promise<void> {
    if (this.#versionChecked === undefined) {
      this.#versionChecked = checkApiVersion(client, { schema: this.#schema });
      this.#versionChecked.catch(() => {
        this.#versionChecked = undefined;
      });
    }
    await this.#versionChecked;
  }
}
