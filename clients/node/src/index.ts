/**
 * `@tombstoned/client`: tombstoned's idempotency protocol in the service's own PostgreSQL
 * transaction, on node-postgres. The core (`claim`, `complete`, `enqueueEvent`, `lookup`), the
 * transaction runner (`Idempotency`), the typed outcomes, one error class per SQLSTATE, and the
 * HTTP answer (`httpAnswer`). Adapters: `@tombstoned/client/express`, `@tombstoned/client/fastify`.
 */

export {
  API_VERSION,
  checkApiVersion,
  claim,
  complete,
  DEFAULT_LOCK_TIMEOUT,
  DEFAULT_REPLAY_WINDOW,
  DEFAULT_SCHEMA,
  enqueueEvent,
  lookup,
} from './core.js';
export type {
  Caller,
  Interval,
  Queryable,
  QueryResultLike,
  SchemaOption,
  Scope,
} from './core.js';
export {
  ClaimNotCompletedError,
  ClaimedTwiceError,
  classify,
  DatabaseUnavailableError,
  InProgressError,
  InvalidArgumentError,
  InvalidIdempotencyKeyError,
  InvalidRequestError,
  NotAllowedError,
  NotClaimedError,
  OutcomeUnknownError,
  OutOfResourcesError,
  ReadOnlyError,
  RetriesExhaustedError,
  SerializationFailureError,
  sqlstateOf,
  TombstonedError,
  UnknownApiVersionError,
  WrongIsolationError,
} from './errors.js';
export type { ClassifyContext } from './errors.js';
export {
  Completed,
  DuplicateBusinessId,
  Expired,
  KeyReused,
  Owner,
  Replay,
  ReplayByBusinessId,
} from './outcomes.js';
export type { ClaimOutcome, ExecuteOutcome, LookupOutcome } from './outcomes.js';
export { DEFAULT_ATTEMPTS, Idempotency } from './runner.js';
export type {
  BusinessId,
  BusinessRecord,
  ClientLike,
  ExecuteOptions,
  Handler,
  IdempotencyOptions,
  PoolClientLike,
  PoolLike,
  Transaction,
} from './runner.js';
export { readIdempotencyKey } from './route.js';
export { httpAnswer, PROBLEM_TYPE_PREFIX } from './answer.js';
export type { AnswerOptions, HttpAnswer } from './answer.js';
