/**
 * The Express adapter (`@tombstoned/client/express`): a route's middleware that reads the
 * `Idempotency-Key`, runs the request under the protocol and sends the answer. Works with
 * Express 4 and 5; the package does not import Express (the types below are what it uses).
 */

import type { HttpAnswer } from './answer.js';
import { answerRequest } from './route.js';
import type { RouteOptions } from './route.js';
import type { Idempotency } from './runner.js';

export { readIdempotencyKey } from './route.js';
export type { RouteOptions } from './route.js';
export type { Caller } from './core.js';

/**
 * What the adapter reads of an Express request (`req.rawHeaders` shows a repeated header), and
 * what a route's functions may read without naming Express's own `Request` type.
 */
export interface ExpressRequestLike {
  readonly rawHeaders: string[];
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body?: unknown;
}

/** What the adapter writes on an Express response (a Node `ServerResponse`). */
export interface ExpressResponseLike {
  statusCode: number;
  setHeader(name: string, value: string | number): unknown;
  end(body: Uint8Array): unknown;
}

/** An Express middleware. */
export type ExpressMiddleware<Req> = (
  req: Req,
  res: ExpressResponseLike,
  next: (error?: unknown) => void,
) => void;

/** Writes an answer as it is (no ETag, no charset added: a replay sends the stored bytes). */
function send(res: ExpressResponseLike, answer: HttpAnswer): void {
  const body = Buffer.from(answer.body, 'utf8');
  res.statusCode = answer.status;
  for (const [name, value] of Object.entries(answer.headers)) res.setHeader(name, value);
  res.setHeader('Content-Length', body.length);
  res.end(body);
}

/**
 * The middleware of a route under the protocol, after the app's authentication and body parser:
 * `app.post('/payments', express.json(), idempotent(idempotency, { ... }))`. The protocol's
 * answers are sent here; the route's own errors go to `next` (the app's error handler); an
 * internal error is logged to the console unless the route gives `onInternalError`.
 */
export function idempotent<Req extends ExpressRequestLike, I>(
  idempotency: Idempotency,
  route: RouteOptions<Req, I>,
): ExpressMiddleware<Req> {
  const log = (error: unknown) => console.error('tombstoned: internal error:', error);
  return (req, res, next) => {
    answerRequest(idempotency, route, req, req.rawHeaders, log).then(
      (answer) => send(res, answer),
      next,
    );
  };
}
