// Type-checked in the scratch project twice, as types.mts (module resolution "import": the ESM
// .d.ts) and as types.cts (resolution "require": the CommonJS .d.ts).
import { httpAnswer, Idempotency, KeyReused } from '@tombstoned/client';
import type { HttpAnswer, PoolLike, Scope } from '@tombstoned/client';
import { idempotent as expressRoute } from '@tombstoned/client/express';
import { idempotent as fastifyRoute } from '@tombstoned/client/fastify';

declare const pool: PoolLike;
const scope: Scope = { tenant: 't', principal: 'p', operation: 'o' };
const runner = new Idempotency(pool, { replayWindow: '24 hours' });
export const answer: HttpAnswer = httpAnswer(new KeyReused());
export const done: Promise<unknown> = runner.execute(scope, 'k', { v: 1 }, (tx) =>
  tx.complete(201, {}),
);
export const routes = [expressRoute, fastifyRoute];
// @ts-expect-error: the status of an answer is a number
export const wrong: string = answer.status;
