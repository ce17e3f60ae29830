import Fastify from 'fastify';
import { Idempotency } from '@tombstoned/client';
import { idempotent } from '@tombstoned/client/fastify';
import { createWidget } from './create-widget.js';

export function fastifyApp(pool, authenticate) {
  const idempotency = new Idempotency(pool); // a pg Pool of the service's role
  const app = Fastify();
  app.post('/widgets', { preHandler: authenticate }, idempotent(idempotency, createWidget));
  return app;
}
