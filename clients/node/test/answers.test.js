// httpAnswer against clients/answers.json, case by case (the Python client's tests read the same
// file, so the two cannot drift). Errors with a SQLSTATE are the server's own: raised by
// PostgreSQL and classified as the runner classifies them.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, test } from 'node:test';

import {
  classify,
  Completed,
  DuplicateBusinessId,
  Expired,
  httpAnswer,
  InvalidRequestError,
  KeyReused,
  OutcomeUnknownError,
  PROBLEM_TYPE_PREFIX,
  readIdempotencyKey,
  Replay,
  ReplayByBusinessId,
  RetriesExhaustedError,
} from '@tombstoned/client';

import { admin, servicePool } from './support/env.js';

const answers = JSON.parse(
  readFileSync(new URL('../../answers.json', import.meta.url), 'utf8'),
);
const pool = servicePool('node-suite-answers');
after(async () => {
  await pool.end();
  await admin.end();
});

const RESOURCE = 'pay-7';
const resourceUrl = (id) => `/payments/${id}`;
const STORED = '{"amount": 1250, "payment_id": "pay-7"}';
const deadline = new Date();

/** The error PostgreSQL raises with `sqlstate`, classified as a statement of the runner's. */
async function raised(sqlstate) {
  const error = await pool
    .query(`DO $$ BEGIN RAISE EXCEPTION 'raised by the test' USING ERRCODE = '${sqlstate}'; END $$`)
    .catch((e) => e);
  assert.equal(error.code, sqlstate);
  return classify(error, { fromDriver: true });
}

/** The inputs that should give `entry`'s answer: [label, outcome or error, expected status]. */
async function inputsOf(entry) {
  switch (entry.case) {
    case 'owner_completed':
      return [['completed', new Completed(201, STORED, RESOURCE, deadline), 201]];
    case 'replay':
      return [
        ['replay 201', new Replay(201, STORED, RESOURCE, deadline), 201],
        ['replay of a stored 422', new Replay(422, STORED, RESOURCE, deadline), 422],
      ];
    case 'replay_by_business_id':
      return [['replay by business id', new ReplayByBusinessId(200, STORED, RESOURCE), 200]];
    case 'key_reused':
      return [['key reused', new KeyReused(), 422]];
    case 'expired':
      return [['expired', new Expired(RESOURCE, deadline, deadline), 410]];
    case 'duplicate_business_id':
      return [['duplicate business id', new DuplicateBusinessId(), 409]];
    case 'missing_or_invalid_key': {
      const repeated = (() => {
        try {
          return readIdempotencyKey(['a', 'b']);
        } catch (error) {
          return error;
        }
      })();
      const invalid = (() => {
        try {
          return readIdempotencyKey(['clé']);
        } catch (error) {
          return error;
        }
      })();
      const missing = (() => {
        try {
          return readIdempotencyKey([]);
        } catch (error) {
          return error;
        }
      })();
      return [
        ['repeated key', repeated, 400],
        ['non-ASCII key', invalid, 400],
        ['missing key', missing, 400],
      ];
    }
    case 'outcome_unknown':
      return [['outcome unknown', new OutcomeUnknownError('lost at COMMIT'), 503]];
    case 'retries_exhausted': {
      const inputs = [];
      for (const sqlstate of entry.sqlstate) {
        const failure = await raised(sqlstate);
        inputs.push([`${sqlstate} escaping the runner`, failure, 503]);
        inputs.push([
          `${sqlstate} on every attempt`,
          new RetriesExhaustedError('busy', { attempts: 3, sqlstate, cause: failure }),
          503,
        ]);
      }
      return inputs;
    }
    default: {
      // A class stands for one of its codes: 08006 connection failure, 53100 disk full.
      const sqlstate = entry.sqlstate ?? { '08': '08006', 53: '53100' }[entry.sqlstate_class];
      return [[`SQLSTATE ${sqlstate}`, await raised(sqlstate), entry.status]];
    }
  }
}

test('every case of clients/answers.json', async (t) => {
  assert.ok(answers.cases.length >= 19);
  assert.equal(answers.problem_type_prefix, PROBLEM_TYPE_PREFIX);
  for (const entry of answers.cases) {
    for (const [label, input, status] of await inputsOf(entry)) {
      await t.test(`${entry.case}: ${label}`, () => {
        const answer = httpAnswer(input, { resourceUrl });
        assert.equal(answer.status, entry.status === 'stored' ? status : entry.status);
        assert.equal(answer.status, status);
        const expected = {};
        for (const [name, value] of Object.entries(entry.headers)) {
          expected[name] = value === 'resource_url' ? resourceUrl(RESOURCE) : value;
        }
        if (entry.problem === undefined) {
          assert.deepEqual(answer.headers, expected);
          assert.equal(answer.body, STORED, 'the stored or complete text, byte for byte');
          return;
        }
        assert.deepEqual(answer.headers, {
          'Content-Type': 'application/problem+json',
          ...expected,
        });
        const { type, title, status: bodyStatus, detail, ...members } = JSON.parse(answer.body);
        assert.equal(type, answers.problem_type_prefix + entry.problem);
        assert.equal(title, entry.title);
        assert.equal(bodyStatus, entry.status);
        assert.equal(typeof detail, 'string');
        const expectedMembers = {};
        for (const name of entry.members ?? []) {
          expectedMembers[name] = name === 'resource_id' ? RESOURCE : resourceUrl(RESOURCE);
        }
        assert.deepEqual(members, expectedMembers);
      });
    }
  }
});

test('without a resource URL: no Location, and the 410 names the id alone', () => {
  const expired = httpAnswer(new Expired(RESOURCE, deadline, null));
  assert.equal(expired.headers.Location, undefined);
  assert.equal(JSON.parse(expired.body).resource_id, RESOURCE);
  assert.equal(JSON.parse(expired.body).resource_url, undefined);
  const replay = httpAnswer(new Replay(201, STORED, RESOURCE, deadline));
  assert.deepEqual(replay.headers, {
    'Content-Type': 'application/json',
    'Idempotent-Replayed': 'true',
  });
});

test('the Idempotency-Key rules: one value of 1-255 visible ASCII characters', () => {
  for (const key of ['a', '~'.repeat(255), '7d1c-pay-1', "!#$%&'*+,-./:;<=>?@[]^_`{|}"]) {
    assert.equal(readIdempotencyKey([key]), key);
  }
  assert.equal(readIdempotencyKey([], { keyOptional: true }), null);
  for (const values of [[], [''], ['a'.repeat(256)], ['has space'], ['tab\tkey'], ['\x7f'],
    ['k-1', 'k-1']]) {
    assert.throws(() => readIdempotencyKey(values), { name: 'InvalidIdempotencyKeyError' });
  }
  assert.throws(() => readIdempotencyKey([''], { keyOptional: true }));
});

test('a resource name names the 410\'s members as the endpoint does (order_id, order_url)', () => {
  const expired = httpAnswer(new Expired(RESOURCE, deadline, null), {
    resourceUrl,
    resourceName: 'payment',
  });
  const { payment_id: id, payment_url: url, resource_id: none } = JSON.parse(expired.body);
  assert.deepEqual([id, url, none], [RESOURCE, resourceUrl(RESOURCE), undefined]);
});

test('a refused request is its problem, with its members and headers', () => {
  const refused = new InvalidRequestError('a valid bearer token is required', {
    status: 401,
    problem: 'unauthenticated',
    title: 'Unauthenticated',
    members: { field: 'authorization' },
    headers: { 'WWW-Authenticate': 'Bearer' },
  });
  const answer = httpAnswer(refused);
  assert.equal(answer.status, 401);
  assert.deepEqual(answer.headers, {
    'Content-Type': 'application/problem+json',
    'WWW-Authenticate': 'Bearer',
  });
  assert.deepEqual(JSON.parse(answer.body), {
    type: `${PROBLEM_TYPE_PREFIX}unauthenticated`,
    title: 'Unauthenticated',
    status: 401,
    detail: 'a valid bearer token is required',
    field: 'authorization',
  });
  const plain = JSON.parse(httpAnswer(new InvalidRequestError('no')).body);
  assert.deepEqual([plain.status, plain.type], [400, `${PROBLEM_TYPE_PREFIX}validation-failed`]);
});

test('an error that is not the protocol\'s is a 500 that says nothing of it', () => {
  const answer = httpAnswer(new Error('secret detail of a bug'));
  assert.equal(answer.status, 500);
  assert.ok(!answer.body.includes('secret'));
});
