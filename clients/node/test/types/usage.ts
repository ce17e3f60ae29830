// Type-checked by `npm run typecheck` (tsc --noEmit), never run: the package's types against the
// real types of pg, Express and Fastify, as a TypeScript service would use them.
import express from 'express';
import Fastify from 'fastify';
import pg from 'pg';

import {
  claim,
  complete,
  DatabaseUnavailableError,
  httpAnswer,
  Idempotency,
  InProgressError,
  InvalidRequestError,
  lookup,
  TombstonedError,
} from '@tombstoned/client';
import type {
  BusinessRecord,
  Caller,
  Completed,
  ExecuteOutcome,
  HttpAnswer,
  Scope,
  Transaction,
} from '@tombstoned/client';
import { idempotent as expressRoute } from '@tombstoned/client/express';
import { idempotent as fastifyRoute } from '@tombstoned/client/fastify';

const pool = new pg.Pool();
const idempotency = new Idempotency(pool, { replayWindow: '24 hours', lockTimeout: 2000 });
const onClient = new Idempotency(new pg.Client(), { schema: 'tombstoned' });

interface Intent {
  v: 1;
  name: string;
}

function intentOf(body: unknown): Intent {
  const name = (body as { name?: unknown } | undefined)?.name;
  if (typeof name !== 'string') throw new InvalidRequestError('name: a string');
  return { v: 1, name };
}

async function write(tx: Transaction<Intent>): Promise<Completed> {
  const { rows } = await tx.query('SELECT 1 AS one');
  const deadline: Date | null = tx.replayDeadline;
  void deadline;
  return tx.complete(201, { name: tx.intent.name, one: rows[0].one }, 'w-1');
}

const callerOf = (tenant: unknown): Caller => ({ tenant: String(tenant), principal: 'p' });

const app = express();
app.post(
  '/widgets',
  express.json(),
  expressRoute(idempotency, {
    operation: 'create-widget',
    caller: (req: express.Request) => callerOf(req.headers['x-tenant']),
    intent: (req) => intentOf(req.body),
    handler: async (tx, req) => {
      await tx.enqueueEvent('w-1', 'widget.created', { path: req.path });
      return write(tx);
    },
    resourceUrl: (id) => `/widgets/${id}`,
    businessId: {
      constraint: 'widgets_request_id_key',
      read: async (client, scope, intent) => {
        const { rows } = await client.query('SELECT $1::text AS body', [
          intent.name + scope.tenant,
        ]);
        const found: BusinessRecord | null =
          rows.length === 0 ? null : { same: true, bodyText: rows[0].body, resourceId: 'w-1' };
        return found;
      },
    },
  }),
);

const fastify = Fastify();
fastify.post(
  '/widgets',
  fastifyRoute(idempotency, {
    operation: 'create-widget',
    caller: (request) => callerOf(request.headers['x-tenant']),
    intent: (request) => intentOf(request.body),
    handler: write,
    keyOptional: true,
  }),
);

async function core(scope: Scope): Promise<HttpAnswer> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN ISOLATION LEVEL READ COMMITTED');
    const outcome = await claim(client, scope, 'k', { v: 1 }, '1 hour', '2 seconds');
    if (outcome.kind === 'replay') {
      const text: string = outcome.bodyText;
      void text;
    }
    if (outcome.kind === 'owner') {
      const deadline: Date = outcome.replayDeadline;
      void deadline;
      await complete(client, scope, 'k', 201, { ok: true }, null);
    }
    const looked = await lookup(client, scope, 'k', { v: 1 });
    // @ts-expect-error: lookup never answers owner
    if (looked?.kind === 'owner') throw new Error('unreachable');
    await client.query('COMMIT');
  } finally {
    client.release();
  }
  const result: ExecuteOutcome = await onClient.execute(scope, 'k', { v: 1 }, (tx) =>
    tx.complete(201, {}),
  );
  try {
    return httpAnswer(result, { resourceUrl: (id) => `/x/${id}`, resourceName: 'payment' });
  } catch (error) {
    if (error instanceof InProgressError) {
      const seconds: number = error.retryAfter;
      void seconds;
    }
    if (error instanceof TombstonedError) {
      const maybe: number | undefined = error.retryAfter;
      void maybe;
    }
    if (error instanceof DatabaseUnavailableError || error instanceof TombstonedError) {
      const sqlstate: string | undefined = error.sqlstate;
      void sqlstate;
    }
    return httpAnswer(error);
  }
}

// @ts-expect-error: a scope names its operation
void core({ tenant: 't', principal: 'p' });
