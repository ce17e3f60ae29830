// The README's samples (samples/): quoted verbatim by clients/node/README.md and by the
// top-level README, and run here under Express and Fastify against the real database: create,
// the replay byte for byte, the key reused.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';

import { expressApp } from '../samples/express.js';
import { fastifyApp } from '../samples/fastify.js';
import { admin, env, prepareService, servicePool, unique, widgetsOf } from './support/env.js';

const pool = servicePool('node-suite-samples');
before(prepareService);
after(async () => {
  await pool.end();
  await admin.end();
});

/** A sample's text from its first import on (its header comment is about the tests). */
function quoted(file) {
  const text = readFileSync(new URL(`../samples/${file}`, import.meta.url), 'utf8');
  return text.slice(text.indexOf('import '));
}

test('the READMEs quote the samples as the files have them', () => {
  for (const readme of ['../README.md', '../../../README.md']) {
    const text = readFileSync(new URL(readme, import.meta.url), 'utf8');
    for (const file of ['create-widget.js', 'express.js', 'fastify.js']) {
      assert.ok(text.includes(quoted(file)), `${readme} does not quote samples/${file}`);
    }
  }
});

/** The samples' "authentication": the caller from two headers. */
const caller = (headers) => ({ tenant: headers['x-tenant'], principal: headers['x-principal'] });

async function exercise(base) {
  assert.equal(env.schema, 'tombstoned', 'the samples use the default schema');
  const [key, requestId] = [unique('sample'), unique('req')];
  const send = (name) =>
    fetch(`${base}/widgets`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'idempotency-key': key,
        'x-tenant': 'acme',
        'x-principal': 'billing',
      },
      body: JSON.stringify({ request_id: requestId, name }),
    });
  const created = await send('bolt');
  const createdText = await created.text();
  assert.equal(created.status, 201, createdText);
  const replay = await send('bolt');
  assert.equal(replay.status, 201);
  assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  assert.equal(await replay.text(), createdText);
  assert.equal((await send('nut')).status, 422);
  assert.equal(await widgetsOf(requestId), 1);
}

test('the Express sample', async () => {
  const app = expressApp(pool, (req, res, next) => {
    req.caller = caller(req.headers);
    next();
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  try {
    await exercise(`http://127.0.0.1:${server.address().port}`);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

test('the Fastify sample', async () => {
  const app = fastifyApp(pool, async (request) => {
    request.caller = caller(request.headers);
  });
  try {
    await exercise(await app.listen({ port: 0, host: '127.0.0.1' }));
  } finally {
    await app.close();
  }
});
