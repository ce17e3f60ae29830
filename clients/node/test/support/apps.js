// The suite's widget service on each adapter: the same route declarations under Express and
// Fastify, served on a free port of 127.0.0.1 by the framework's real server.
import express from 'express';
import Fastify from 'fastify';

import { InvalidRequestError } from '@tombstoned/client';
import { idempotent as expressRoute } from '@tombstoned/client/express';
import { idempotent as fastifyRoute } from '@tombstoned/client/fastify';

import { NOT_GRANTED, OPERATION } from './env.js';
import { widgetBusinessId, widgetIntent, writeWidget } from './widgets.js';

/**
 * What a test does to a request's business write, by its headers: `x-test-hold: NAME` waits for
 * the test to open the gate of that name after the write (an owner in flight);
 * `x-test-fail: 1` raises after the write.
 */
export class Hooks {
  constructor() {
    this.gates = new Map();
  }

  /** A gate the request with `x-test-hold: name` waits at; `reached` resolves when it does. */
  hold(name) {
    let reach;
    let open;
    const gate = {
      reached: new Promise((resolve) => {
        reach = resolve;
      }),
      opened: new Promise((resolve) => {
        open = resolve;
      }),
    };
    gate.reach = reach;
    gate.open = open;
    this.gates.set(name, gate);
    return gate;
  }

  async afterWrite(headers) {
    const gate = this.gates.get(headers['x-test-hold']);
    if (gate !== undefined) {
      gate.reach();
      await gate.opened;
    }
    if (headers['x-test-fail'] === '1') throw new Error('the business failed after its write');
  }
}

/** The routes both apps serve, by path. */
export function widgetRoutes(hooks) {
  const route = (overrides = {}) => ({
    operation: OPERATION,
    // The test's "authentication": the caller's tenant and principal from two headers.
    caller: (req) => {
      const [tenant, principal] = [req.headers['x-tenant'], req.headers['x-principal']];
      if (!tenant || !principal) {
        throw new InvalidRequestError('Who are you?', {
          status: 401,
          problem: 'unauthenticated',
          title: 'A valid bearer token is required',
        });
      }
      return { tenant, principal };
    },
    intent: (req) => widgetIntent(req.body),
    handler: async (tx, req) => {
      const completion = await writeWidget(tx);
      await hooks.afterWrite(req.headers);
      return completion;
    },
    resourceUrl: (id) => `/widgets/${id}`,
    businessId: widgetBusinessId,
    onInternalError: () => {},
    ...overrides,
  });
  return {
    '/widgets': route(),
    // A claim here waits 1 s for the key's owner, then 409.
    '/widgets/impatient': route({ lockTimeout: '1 second' }),
    // Keys replay for 3 s: the stress run sees them expire and tombstoned.
    '/widgets/short': route({ replayWindow: '3 seconds' }),
    '/widgets/optional': route({ keyOptional: true }),
    // An operation the service role was not granted: its claim is refused (42501).
    '/widgets/elsewhere': route({ operation: NOT_GRANTED }),
  };
}

/** The Express app on a real server; its own error handler answers the route's own errors. */
export async function startExpress(idempotency, hooks) {
  const app = express();
  for (const [path, route] of Object.entries(widgetRoutes(hooks))) {
    app.post(path, express.json(), expressRoute(idempotency, route));
  }
  app.use((error, req, res, next) => {
    res.status(error.status ?? 500).json({ error: 'the app\'s error handler' });
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const close = () => {
    server.closeAllConnections();
    return new Promise((resolve) => server.close(resolve));
  };
  return { base: `http://127.0.0.1:${server.address().port}`, close };
}

/** The Fastify app on its real server (its JSON parser, its error handler). */
export async function startFastify(idempotency, hooks) {
  const app = Fastify();
  for (const [path, route] of Object.entries(widgetRoutes(hooks))) {
    app.post(path, fastifyRoute(idempotency, route));
  }
  const base = await app.listen({ port: 0, host: '127.0.0.1' });
  return { base, close: () => app.close() };
}
