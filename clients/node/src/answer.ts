/**
 * The one function from an outcome or an error to the HTTP answer the endpoint itself gives
 * (clients/answers.json, docs/api.md "Answers"): status, headers, and the body text — the stored
 * text byte for byte for a replay, `complete`'s text for the owner, an RFC 9457 problem otherwise.
 */

import {
  DatabaseUnavailableError,
  InProgressError,
  InvalidIdempotencyKeyError,
  InvalidRequestError,
  OutcomeUnknownError,
  OutOfResourcesError,
  ReadOnlyError,
  RetriesExhaustedError,
  SerializationFailureError,
  TombstonedError,
} from './errors.js';
import type { ExecuteOutcome } from './outcomes.js';

/** The prefix of every problem's `type`; the problem's name follows it. */
export const PROBLEM_TYPE_PREFIX = 'tag:tombstoned,2026:problem:';

/** An HTTP answer, ready to send. */
export interface HttpAnswer {
  status: number;
  headers: Record<string, string>;
  /** The body, as text (UTF-8 on the wire). */
  body: string;
}

/** How a route names the object a key produced. */
export interface AnswerOptions {
  /** The URL of a resource id (`Location`, and the 410's `<name>_url`); no `Location` without. */
  resourceUrl?: (resourceId: string) => string;
  /** The 410's members are `<name>_id` and `<name>_url`. Default `resource`. */
  resourceName?: string;
}

/** A problem type: status, name, fixed title. */
interface ProblemKind {
  status: number;
  name: string;
  title: string;
}

const KEY_REUSED: ProblemKind = {
  status: 422,
  name: 'idempotency-key-reused',
  title: 'This idempotency key was used for a different request',
};
const EXPIRED: ProblemKind = {
  status: 410,
  name: 'replay-window-expired',
  title: 'The replay window of this idempotency key is over',
};
const DUPLICATE: ProblemKind = {
  status: 409,
  name: 'duplicate-request-id',
  title: 'This request_id already has a different order',
};
const IN_PROGRESS: ProblemKind = {
  status: 409,
  name: 'request-in-progress',
  title: 'A request with this idempotency key is in progress',
};
const INVALID_KEY: ProblemKind = {
  status: 400,
  name: 'invalid-idempotency-key',
  title: 'The Idempotency-Key header is missing or invalid',
};
const UNAVAILABLE: ProblemKind = {
  status: 503,
  name: 'database-unavailable',
  title: 'The database is unavailable',
};
const OUTCOME_UNKNOWN: ProblemKind = {
  status: 503,
  name: 'outcome-unknown',
  title: 'The outcome of this request is unknown',
};
const INTERNAL: ProblemKind = { status: 500, name: 'internal-error', title: 'Internal error' };

function problem(
  kind: ProblemKind,
  detail: string,
  headers: Record<string, string> = {},
  members: Record<string, unknown> = {},
): HttpAnswer {
  const document = {
    type: PROBLEM_TYPE_PREFIX + kind.name,
    title: kind.title,
    status: kind.status,
    detail,
    ...members,
  };
  return {
    status: kind.status,
    headers: { 'Content-Type': 'application/problem+json', ...headers },
    body: JSON.stringify(document),
  };
}

function json(status: number, body: string, headers: Record<string, string>): HttpAnswer {
  return { status, headers: { 'Content-Type': 'application/json', ...headers }, body };
}

/**
 * The answer to an outcome of the runner, or to anything it threw. An error that is not the
 * protocol's (the handler's own, a bug) is a 500 that says nothing of it.
 */
export function httpAnswer(
  result: ExecuteOutcome | unknown,
  options: AnswerOptions = {},
): HttpAnswer {
  const location = (resourceId: string | null): Record<string, string> =>
    resourceId !== null && options.resourceUrl !== undefined
      ? { Location: options.resourceUrl(resourceId) }
      : {};
  const outcome = result as ExecuteOutcome;
  switch (outcome?.kind) {
    case 'completed':
      return json(outcome.statusCode, outcome.bodyText, location(outcome.resourceId));
    case 'replay':
    case 'replay_by_business_id':
      return json(outcome.statusCode, outcome.bodyText, {
        'Idempotent-Replayed': 'true',
        ...location(outcome.resourceId),
      });
    case 'key_reused':
      return problem(
        KEY_REUSED,
        'This idempotency key was first used for a request with different parameters. ' +
          'A new request needs a new key.',
      );
    case 'expired': {
      const name = options.resourceName ?? 'resource';
      const headers = location(outcome.resourceId);
      const members: Record<string, unknown> = { [`${name}_id`]: outcome.resourceId };
      if (headers.Location !== undefined) members[`${name}_url`] = headers.Location;
      return problem(
        EXPIRED,
        'The stored response for this idempotency key is past its replay window and is no ' +
          'longer kept. The request was not executed again; look the resource up instead.',
        headers,
        members,
      );
    }
    case 'duplicate_business_id':
      return problem(DUPLICATE, 'This business id already belongs to another request.');
    default:
      return errorAnswer(result);
  }
}

function errorAnswer(error: unknown): HttpAnswer {
  if (!(error instanceof TombstonedError)) return problem(INTERNAL, 'Internal error.');
  const retry: Record<string, string> =
    error.retryAfter === undefined ? {} : { 'Retry-After': String(error.retryAfter) };
  if (error instanceof InProgressError) {
    return problem(
      IN_PROGRESS,
      'A request with this idempotency key is still in progress: retry with the same key.',
      retry,
    );
  }
  if (error instanceof InvalidIdempotencyKeyError) {
    return problem(INVALID_KEY, error.message);
  }
  if (error instanceof InvalidRequestError) {
    const kind = { status: error.status, name: error.problem, title: error.title };
    return problem(kind, error.message, error.headers, error.members);
  }
  if (error instanceof ReadOnlyError) {
    return problem(
      UNAVAILABLE,
      'The database accepts no writes now; nothing was done. Retry with the same key.',
      retry,
    );
  }
  if (error instanceof DatabaseUnavailableError) {
    return problem(
      UNAVAILABLE,
      'The database is unavailable; nothing was done. Retry with the same key.',
      retry,
    );
  }
  if (error instanceof OutOfResourcesError) {
    return problem(UNAVAILABLE, 'The database is out of resources; nothing was done.', retry);
  }
  if (error instanceof RetriesExhaustedError || error instanceof SerializationFailureError) {
    return problem(
      UNAVAILABLE,
      'The database is busy; nothing was done. Retry with the same key.',
      retry,
    );
  }
  if (error instanceof OutcomeUnknownError) {
    return problem(
      OUTCOME_UNKNOWN,
      'The connection failed after the request was sent to the database: it may have been ' +
        'done. Retry with the same key to learn its outcome.',
      retry,
    );
  }
  // The rest are bugs of the caller or of its set-up (22023, TS002-TS005, 42501, an unknown
  // api_version()): nothing of them is the client's business.
  return problem(INTERNAL, 'Internal error.');
}
