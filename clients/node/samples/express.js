import express from 'express';
import { Idempotency } from '@tombstoned/client';
import { idempotent } from '@tombstoned/client/express';
import { createWidget } from './create-widget.js';

export function expressApp(pool, authenticate) {
  const idempotency = new Idempotency(pool); // a pg Pool of the service's role
  const app = express();
  app.post('/widgets', authenticate, express.json(), idempotent(idempotency, createWidget));
  return app;
}
