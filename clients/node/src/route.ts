/**
 * What the Express and Fastify adapters share: a route's declaration, the `Idempotency-Key`
 * header's rules, and the request's way from the header to the HTTP answer. The adapters only
 * read their framework's request and write its reply.
 */

import { httpAnswer } from './answer.js';
import type { HttpAnswer } from './answer.js';
import type { Caller, Interval, Scope } from './core.js';
import { InvalidIdempotencyKeyError, sqlstateOf, TombstonedError } from './errors.js';
import type { Completed } from './outcomes.js';
import type { BusinessId, Idempotency, Transaction } from './runner.js';

/** A route under the protocol: its operation, and how its request maps onto the protocol. */
export interface RouteOptions<Req, I> {
  /** The operation, the third part of the scope (`create-payment`). */
  operation: string;
  /**
   * The caller's tenant and principal, from its authentication — never from the body. Runs
   * before any transaction: throw `InvalidRequestError` (e.g. a 401) to refuse the request.
   */
  caller(req: Req): Caller | Promise<Caller>;
  /**
   * The normalised intent: only what changes the business result, defaults applied, amounts as
   * integers. Runs before any transaction: throw `InvalidRequestError` to refuse the request
   * (400 by default), which then consumes no key.
   */
  intent(req: Req): I | Promise<I>;
  /**
   * The business write, inside the transaction, run only when the request owns the key; returns
   * `tx.complete(...)`.
   */
  handler(tx: Transaction<I>, req: Req): Promise<Completed | undefined | void>;
  /** The URL of the object a key produced (`Location` of a replay and of the 410). */
  resourceUrl?: (resourceId: string) => string;
  /** The 410's members are `<name>_id` and `<name>_url`. Default `resource`. */
  resourceName?: string;
  /** Without the header the handler runs without the protocol (no claim). Default false. */
  keyOptional?: boolean;
  /** The business id's unique constraint and how to read its object (the 23505 path). */
  businessId?: BusinessId<I>;
  replayWindow?: Interval;
  lockTimeout?: Interval;
  /** Called with an error answered 500 (a bug: the answer says nothing of it). */
  onInternalError?: (error: unknown, req: Req) => void;
}

/** The rule of the `Idempotency-Key` header: 1-255 visible ASCII characters (0x21-0x7E). */
const KEY = /^[\x21-\x7e]{1,255}$/;

/**
 * The `Idempotency-Key` from a request's values of that header: exactly one, 1-255 visible
 * ASCII characters. Null when absent and `keyOptional`; otherwise `InvalidIdempotencyKeyError`
 * (400, before any transaction).
 */
export function readIdempotencyKey(
  values: readonly string[],
  options: { keyOptional?: boolean } = {},
): string | null {
  if (values.length > 1) {
    throw new InvalidIdempotencyKeyError('Send exactly one Idempotency-Key header.');
  }
  const [key] = values;
  if (key === undefined) {
    if (options.keyOptional === true) return null;
    throw new InvalidIdempotencyKeyError('This request needs an Idempotency-Key header.');
  }
  if (!KEY.test(key)) {
    throw new InvalidIdempotencyKeyError(
      'The Idempotency-Key must be 1 to 255 visible ASCII characters.',
    );
  }
  return key;
}

/** The values of the `Idempotency-Key` header in Node's raw header list (a repeat is seen). */
export function keyHeaderValues(rawHeaders: readonly string[]): string[] {
  const values: string[] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if (rawHeaders[i]!.toLowerCase() === 'idempotency-key') values.push(rawHeaders[i + 1]!);
  }
  return values;
}

/**
 * The answer to one request of a route; errors of the protocol and of the database are answered,
 * the route's own errors (no SQLSTATE) are thrown for the framework's error handling.
 */
export async function answerRequest<Req, I>(
  idempotency: Idempotency,
  route: RouteOptions<Req, I>,
  req: Req,
  rawHeaders: readonly string[],
  logInternal: (error: unknown, req: Req) => void,
): Promise<HttpAnswer> {
  const options = { resourceUrl: route.resourceUrl, resourceName: route.resourceName };
  try {
    const key = readIdempotencyKey(keyHeaderValues(rawHeaders), {
      keyOptional: route.keyOptional,
    });
    const caller = await route.caller(req);
    const scope: Scope = {
      tenant: caller.tenant,
      principal: caller.principal,
      operation: route.operation,
    };
    const intent = await route.intent(req);
    const handler = (tx: Transaction<I>) => route.handler(tx, req);
    const outcome = await idempotency.execute(scope, key, intent, handler, {
      businessId: route.businessId,
      replayWindow: route.replayWindow,
      lockTimeout: route.lockTimeout,
    });
    return httpAnswer(outcome, options);
  } catch (error) {
    if (!(error instanceof TombstonedError) && sqlstateOf(error) === undefined) throw error;
    const answer = httpAnswer(error, options);
    if (answer.status === 500) (route.onInternalError ?? logInternal)(error, req);
    return answer;
  }
}
