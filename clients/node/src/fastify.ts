/**
 * The Fastify adapter (`@tombstoned/client/fastify`): a route's handler that reads the
 * `Idempotency-Key`, runs the request under the protocol and sends the answer. Works with
 * Fastify 4 and 5; the package does not import Fastify (the types below are what it uses).
 */

import { answerRequest } from './route.js';
import type { RouteOptions } from './route.js';
import type { Idempotency } from './runner.js';

export { readIdempotencyKey } from './route.js';
export type { RouteOptions } from './route.js';
export type { Caller } from './core.js';

/**
 * What the adapter reads of a Fastify request (`raw.rawHeaders` shows a repeated header), and
 * what a route's functions may read without naming Fastify's own `FastifyRequest` type.
 */
export interface FastifyRequestLike {
  readonly raw: { readonly rawHeaders: string[] };
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body?: unknown;
  readonly log?: { error(object: unknown, message?: string): void };
}

/** What the adapter writes on a Fastify reply. */
export interface FastifyReplyLike {
  code(status: number): FastifyReplyLike;
  header(name: string, value: string): FastifyReplyLike;
  send(payload: Uint8Array): FastifyReplyLike;
}

/** A Fastify route handler. */
export type FastifyHandler<Req, Reply> = (request: Req, reply: Reply) => Promise<Reply>;

/**
 * The handler of a route under the protocol: `app.post('/payments', idempotent(idempotency,
 * { ... }))` (Fastify parses the JSON body first). The protocol's answers are sent here; the
 * route's own errors are thrown to Fastify's error handler; an internal error is logged with
 * `request.log` unless the route gives `onInternalError`.
 */
export function idempotent<Req extends FastifyRequestLike, I, Reply extends FastifyReplyLike>(
  idempotency: Idempotency,
  route: RouteOptions<Req, I>,
): FastifyHandler<Req, Reply> {
  const log = (error: unknown, request: Req) =>
    request.log?.error({ err: error }, 'tombstoned: internal error');
  return async (request, reply) => {
    const answer = await answerRequest(idempotency, route, request, request.raw.rawHeaders, log);
    reply.code(answer.status);
    for (const [name, value] of Object.entries(answer.headers)) reply.header(name, value);
    // A Buffer is sent as it is: a string would get `; charset=utf-8` added to Content-Type.
    reply.send(Buffer.from(answer.body, 'utf8'));
    return reply;
  };
}
