// The caller's trace context (issue 40): enqueueEvent stores the W3C traceparent of the active
// OpenTelemetry span with the event, nothing without one. The relay carrying it to the webhook
// receiver is shown end to end by tests/it/traces.rs.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';

import { context, trace, TraceFlags } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';

import { enqueueEvent } from '@tombstoned/client';

import { admin, adminRows, env, servicePool } from './support/env.js';

const pool = servicePool('node-suite-trace');
const schema = { schema: env.schema };

// What an instrumented service's SDK registers: a context that follows async calls.
const contextManager = new AsyncLocalStorageContextManager().enable();
before(() => context.setGlobalContextManager(contextManager));
after(async () => {
  context.disable();
  await pool.end();
  await admin.end();
});

/** `work` on a pooled connection inside one committed transaction. */
async function committed(work) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN ISOLATION LEVEL READ COMMITTED');
    const value = await work(client);
    await client.query('COMMIT');
    return value;
  } finally {
    client.release();
  }
}

async function storedTraceparent(event) {
  const rows = await adminRows(
    `SELECT traceparent FROM "${env.schema}".outbox_events WHERE event_id = $1`,
    [event],
  );
  assert.equal(rows.length, 1);
  return rows[0].traceparent;
}

test('the active span is stored with the event; without one, nothing', async () => {
  const traceId = randomBytes(16).toString('hex');
  const spanId = randomBytes(8).toString('hex');
  const span = trace.wrapSpanContext({ traceId, spanId, traceFlags: TraceFlags.SAMPLED });
  const traced = await context.with(trace.setSpan(context.active(), span), () =>
    committed((client) => enqueueEvent(client, 'acme', 'trace-node', 'trace.checked', {}, schema)));
  assert.equal(await storedTraceparent(traced), `00-${traceId}-${spanId}-01`);

  const untraced = await committed((client) =>
    enqueueEvent(client, 'acme', 'trace-node', 'trace.checked', {}, schema));
  assert.equal(await storedTraceparent(untraced), null);
});
