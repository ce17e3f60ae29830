// The adapters' contract, run against each one under its real server and driven by a real HTTP
// client (node's fetch): the Idempotency-Key rules, a refused intent consuming no key, create ->
// replay byte for byte -> reuse 422 -> a second request waiting on the first's lock (seen in
// pg_stat_activity) -> 409 or replay -> the daemon's cleaner -> 410 -> reuse still 422; the
// handler raising after its write; the business id's 23505; a bounded stress run with the cleaner
// running.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Idempotency } from '@tombstoned/client';

import { Hooks } from './apps.js';
import {
  admin,
  env,
  expireKey,
  isTombstone,
  NOT_GRANTED,
  prepareService,
  recordsOf,
  runCleaner,
  servicePool,
  unique,
  waitForLockWait,
  widgetsOf,
} from './env.js';

/** Seconds the stress run lasts (TOMBSTONED_CLIENT_STRESS_SECS; default 8). */
const STRESS_SECS = Number(process.env.TOMBSTONED_CLIENT_STRESS_SECS ?? 8);

const CALLER = { 'x-tenant': 'acme', 'x-principal': 'billing' };

/** One HTTP answer, whole: status, headers, the body's bytes and text. */
async function post(base, path, { key, body, headers = {} }) {
  const response = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      ...CALLER,
      ...(key === undefined ? {} : { 'idempotency-key': key }),
      ...headers,
    },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const bytes = Buffer.from(await response.arrayBuffer());
  return {
    status: response.status,
    headers: response.headers,
    bytes,
    text: bytes.toString('utf8'),
    json: () => JSON.parse(bytes.toString('utf8')),
    replayed: response.headers.get('idempotent-replayed') === 'true',
  };
}

/** The problem's name of an RFC 9457 answer. */
function problemOf(answer) {
  assert.equal(answer.headers.get('content-type'), 'application/problem+json', answer.text);
  return answer.json().type.replace('tag:tombstoned,2026:problem:', '');
}

/** Every test of the contract, on the adapter `start` serves. */
export function adapterSuite(name, start) {
  const application = `node-suite-${name}`;
  const pool = servicePool(application);
  const idempotency = new Idempotency(pool, { schema: env.schema, lockTimeout: '10 seconds' });
  const hooks = new Hooks();
  let server;
  before(async () => {
    await prepareService();
    server = await start(idempotency, hooks);
  });
  after(async () => {
    await server.close();
    await pool.end();
    await admin.end();
  });
  const base = () => server.base;
  const widget = (requestId, name = 'bolt') => ({ request_id: requestId, name });

  test(`${name}: the Idempotency-Key header is required, once, 1-255 visible ASCII`, async () => {
    const body = widget(unique('req'));
    const cases = [
      ['missing', undefined, {}],
      ['empty', '', {}],
      ['a space inside', 'a b', {}],
      ['256 characters', 'k'.repeat(256), {}],
      ['not ASCII', 'cl\u00e9', {}],
    ];
    for (const [label, key] of cases) {
      const answer = await post(base(), '/widgets', { key, body });
      assert.equal(answer.status, 400, `${label}: ${answer.text}`);
      assert.equal(problemOf(answer), 'invalid-idempotency-key', label);
    }
    const twice = await fetch(`${base()}/widgets`, {
      method: 'POST',
      headers: [
        ['content-type', 'application/json'],
        ['x-tenant', 'acme'],
        ['x-principal', 'billing'],
        ['idempotency-key', 'k-one'],
        ['idempotency-key', 'k-two'],
      ],
      body: JSON.stringify(body),
    });
    assert.equal(twice.status, 400);
    assert.equal(await widgetsOf(body.request_id), 0);
    const longest = unique('k').padEnd(255, '~');
    assert.equal((await post(base(), '/widgets', { key: longest, body })).status, 201);
  });

  test(`${name}: a refused intent consumes no key; a route may make the key optional`, async () => {
    const key = unique('k-refused');
    const requestId = unique('req');
    const refused = await post(base(), '/widgets', { key, body: { request_id: requestId } });
    assert.equal(refused.status, 400, refused.text);
    assert.equal(problemOf(refused), 'validation-failed');
    assert.equal(await recordsOf(key), 0);
    const stranger = await post(base(), '/widgets', {
      key,
      body: widget(requestId),
      headers: { 'x-tenant': '' },
    });
    assert.equal(stranger.status, 401);
    const created = await post(base(), '/widgets', { key, body: widget(requestId) });
    assert.equal(created.status, 201, 'the corrected request reuses the key');

    const optional = await post(base(), '/widgets/optional', { body: widget(unique('req')) });
    assert.equal(optional.status, 201, optional.text);
    assert.equal(optional.replayed, false);
  });

  test(`${name}: create, replay, reuse, in flight, tombstoned, expired`, async () => {
    const key = unique('k');
    const requestId = unique('req');

    const created = await post(base(), '/widgets', { key, body: widget(requestId) });
    assert.equal(created.status, 201, created.text);
    assert.equal(created.replayed, false);
    assert.equal(created.headers.get('content-type'), 'application/json');
    const id = created.json().widget_id;
    assert.equal(created.headers.get('location'), `/widgets/${id}`);

    // The lost response's retry, its fields in another order: the same bytes, marked.
    const replay = await post(base(), '/widgets', {
      key,
      body: `{"name": "bolt", "request_id": ${JSON.stringify(requestId)}, "trace": "t-1"}`,
    });
    assert.equal(replay.status, 201);
    assert.equal(replay.replayed, true);
    assert.deepEqual(replay.bytes, created.bytes, 'byte-identical');
    assert.equal(replay.headers.get('location'), `/widgets/${id}`);

    const reused = await post(base(), '/widgets', { key, body: widget(requestId, 'nut') });
    assert.equal(reused.status, 422);
    assert.equal(problemOf(reused), 'idempotency-key-reused');
    assert.ok(!reused.text.includes(id), 'nothing of the stored answer');

    // Two requests with one key: the second waits on the first's lock, seen in
    // pg_stat_activity, and gets 409 + Retry-After once its claim's lock timeout (1 s) passes
    // with the first still in flight; a third, waiting longer, replays the first's answer.
    const busyKey = unique('k-busy');
    const busyRequest = unique('req');
    const gate = hooks.hold(busyKey);
    const first = post(base(), '/widgets', {
      key: busyKey,
      body: widget(busyRequest),
      headers: { 'x-test-hold': busyKey },
    });
    await gate.reached; // the first owns the key, its widget written, its transaction open
    const second = post(base(), '/widgets/impatient', { key: busyKey, body: widget(busyRequest) });
    await waitForLockWait(application);
    const busy = await second;
    assert.equal(busy.status, 409, busy.text);
    assert.equal(problemOf(busy), 'request-in-progress');
    assert.equal(busy.headers.get('retry-after'), '1');
    const third = post(base(), '/widgets', { key: busyKey, body: widget(busyRequest) });
    await waitForLockWait(application);
    gate.open();
    const [owner, waited] = await Promise.all([first, third]);
    assert.equal(owner.status, 201, owner.text);
    assert.equal(waited.status, 201, waited.text);
    assert.equal(waited.replayed, true);
    assert.deepEqual(waited.bytes, owner.bytes);
    assert.equal(await widgetsOf(busyRequest), 1);

    // The window over, the daemon's real cleaner makes the record a tombstone; the retry gets
    // 410 pointing at the widget, never a second one; another intent is still refused.
    await expireKey(key);
    const report = await runCleaner();
    assert.ok(report.rows_tombstoned >= 1, JSON.stringify(report));
    assert.ok(await isTombstone(key));
    const gone = await post(base(), '/widgets', { key, body: widget(requestId) });
    assert.equal(gone.status, 410, gone.text);
    assert.equal(problemOf(gone), 'replay-window-expired');
    assert.equal(gone.headers.get('location'), `/widgets/${id}`);
    assert.equal(gone.json().resource_id, id);
    assert.equal(gone.json().resource_url, `/widgets/${id}`);
    const stillReused = await post(base(), '/widgets', { key, body: widget(requestId, 'nut') });
    assert.equal(stillReused.status, 422);
    assert.equal(await widgetsOf(requestId), 1);
  });

  test(`${name}: the handler raising after its write: nothing committed, key free`, async () => {
    const key = unique('k-fail');
    const requestId = unique('req');
    const failed = await post(base(), '/widgets', {
      key,
      body: widget(requestId),
      headers: { 'x-test-fail': '1' },
    });
    assert.equal(failed.status, 500, 'the framework\'s error handling answers');
    assert.equal(await widgetsOf(requestId), 0);
    assert.equal(await recordsOf(key), 0);
    const retried = await post(base(), '/widgets', { key, body: widget(requestId) });
    assert.equal(retried.status, 201);
    assert.equal(retried.replayed, false);
  });

  test(`${name}: an operation the role does not hold is a 500 that names nothing`, async () => {
    const [key, requestId] = [unique('k-elsewhere'), unique('req')];
    const refused = await post(base(), '/widgets/elsewhere', { key, body: widget(requestId) });
    assert.equal(refused.status, 500, refused.text);
    assert.equal(problemOf(refused), 'internal-error');
    assert.equal(refused.json().detail, 'Internal error.');
    for (const secret of [NOT_GRANTED, env.serviceRole, '42501', key]) {
      assert.ok(!refused.text.includes(secret), `the answer names ${secret}`);
    }
    assert.equal(await recordsOf(key), 0);
    assert.equal(await widgetsOf(requestId), 0);
  });

  test(`${name}: the business id under a new key replays, or conflicts`, async () => {
    const requestId = unique('req');
    const created = await post(base(), '/widgets', { key: unique('k'), body: widget(requestId) });
    assert.equal(created.status, 201);
    const newKey = unique('k-new');
    const again = await post(base(), '/widgets', { key: newKey, body: widget(requestId) });
    assert.equal(again.status, 200, again.text);
    assert.equal(again.replayed, true);
    assert.deepEqual(again.bytes, created.bytes);
    assert.equal(again.headers.get('location'), created.headers.get('location'));
    const other = await post(base(), '/widgets', {
      key: unique('k'),
      body: widget(requestId, 'nut'),
    });
    assert.equal(other.status, 409);
    assert.equal(problemOf(other), 'duplicate-request-id');
    assert.ok(!other.text.includes(created.json().widget_id));
    assert.equal(await recordsOf(newKey), 0);
  });

  test(`${name}: a stress run with the cleaner running keeps every invariant`, async () => {
    // Twelve keys made first, replayable for 3 s: during the run they are replayed, reused for
    // another intent, sent under fresh keys (the business id), expire and are tombstoned by the
    // cleaner running beside; meanwhile new keys are claimed by two requests at once.
    const prefix = unique('stress');
    const made = new Map(); // requestId -> { key, text }
    for (let i = 0; i < 12; i += 1) {
      const [key, requestId] = [`${prefix}-k${i}`, `${prefix}-r${i}`];
      const answer = await post(base(), '/widgets/short', { key, body: widget(requestId) });
      assert.equal(answer.status, 201, answer.text);
      made.set(requestId, { key, text: answer.text });
    }
    const deadline = Date.now() + STRESS_SECS * 1000;
    const seen = []; // { sent, key, requestId, name, status, replayed, text }
    const pairs = []; // the answers of two requests with one new key, sent at once
    let cleanerRuns = 0;
    let tombstoned = 0;
    const cleaner = (async () => {
      while (Date.now() < deadline) {
        const report = await runCleaner();
        cleanerRuns += 1;
        tombstoned += report.rows_tombstoned;
      }
    })();
    const send = async (key, requestId, name) => {
      const sent = Date.now();
      const answer = await post(base(), '/widgets/short', { key, body: widget(requestId, name) });
      return { sent, key, requestId, name, ...answer };
    };
    const requests = [...made.keys()];
    const worker = async () => {
      while (Date.now() < deadline) {
        const requestId = requests[Math.floor(Math.random() * requests.length)];
        const { key } = made.get(requestId);
        const roll = Math.random();
        if (roll < 0.1) {
          const [k, r] = [unique(`${prefix}-new`), unique(`${prefix}-new`)];
          pairs.push(await Promise.all([send(k, r, 'bolt'), send(k, r, 'bolt')]));
        } else if (roll < 0.2) {
          seen.push(await send(key, requestId, 'other'));
        } else if (roll < 0.3) {
          seen.push(await send(unique(`${prefix}-alias`), requestId, 'bolt'));
        } else {
          seen.push(await send(key, requestId, 'bolt'));
        }
      }
    };
    await Promise.all([cleaner, ...Array.from({ length: 6 }, worker)]);

    const statuses = {};
    for (const a of [...seen, ...pairs.flat()]) {
      statuses[a.status] = (statuses[a.status] ?? 0) + 1;
    }
    const summary = JSON.stringify(statuses);
    assert.ok(tombstoned > 0, `the cleaner tombstoned nothing in ${cleanerRuns} runs`);
    assert.ok(statuses[410] > 0, `no key expired during the run: ${summary}`);
    const firstGone = new Map(); // key -> when its first 410 arrived
    for (const a of seen) {
      const context = `${a.key} ${a.name}: ${a.status} ${a.text}`;
      if (a.name === 'other') {
        assert.equal(a.status, 422, context); // reuse: refused before and after expiry
        continue;
      }
      // The same intent: its bytes (a replay, or the business id's replay under a fresh key),
      // or 410 once the window is over. Nothing was executed again.
      assert.ok([200, 201, 410].includes(a.status), context);
      assert.ok(a.status === 410 || (a.replayed && a.text === made.get(a.requestId).text), context);
      if (a.status === 410 && !firstGone.has(a.key)) firstGone.set(a.key, Date.now());
    }
    for (const a of seen) {
      // After a key's first 410, no request of it was answered from its body again.
      const gone = firstGone.get(a.key);
      if (gone !== undefined && a.sent > gone) assert.equal(a.status, 410, a.key);
    }
    for (const requestId of requests) assert.equal(await widgetsOf(requestId), 1, requestId);
    // Two requests, one new key: one owner, one replay of its bytes (or 409), one widget.
    for (const pair of pairs) {
      const fresh = pair.filter((a) => a.status === 201 && !a.replayed);
      assert.equal(fresh.length, 1, JSON.stringify(pair.map((a) => [a.status, a.replayed])));
      for (const a of pair) {
        assert.ok(a.status === 409 || a.text === fresh[0].text, `${a.status} ${a.text}`);
      }
      assert.equal(await widgetsOf(pair[0].requestId), 1);
    }
    const total = seen.length + 2 * pairs.length;
    console.log(`${name} stress: ${total} requests in ${STRESS_SECS} s, ${summary}; ` +
      `${cleanerRuns} cleaner runs tombstoned ${tombstoned}`);
  });
}
