// The package as a service installs it: `npm pack` (of the build clients/setup made), the
// tarball installed into a scratch project in a temporary directory (from npm's cache where it
// can), then imported as an ES module and required as CommonJS, and its .d.ts type-checked for
// both module systems. A file missing from `files` or a wrong `exports` entry fails here.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
const root = fileURLToPath(new URL('..', import.meta.url));
const fixtures = fileURLToPath(new URL('scratch/', import.meta.url));
const scratch = mkdtempSync(join(tmpdir(), 'tombstoned-client-scratch-'));
const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
let packed;

before(async () => {
  // --ignore-scripts: the build is clients/setup's (prepack would rebuild dist/ under the feet
  // of an example that loads it meanwhile).
  const { stdout } = await run(
    'npm',
    ['pack', '--ignore-scripts', '--json', '--pack-destination', scratch],
    { cwd: root },
  );
  [packed] = JSON.parse(stdout);
  writeFileSync(
    join(scratch, 'package.json'),
    JSON.stringify({ name: 'scratch', version: '0.0.0', private: true }),
  );
  for (const file of ['check.mjs', 'check.cjs', 'summary.cjs', 'tsconfig.json']) {
    copyFileSync(join(fixtures, file), join(scratch, file));
  }
  copyFileSync(join(fixtures, 'types.ts'), join(scratch, 'types.mts'));
  copyFileSync(join(fixtures, 'types.ts'), join(scratch, 'types.cts'));
  // pg, the peer dependency, comes along (npm installs peers); Express and Fastify do not.
  await run(
    'npm',
    ['install', '--prefer-offline', '--no-audit', '--no-fund', join(scratch, packed.filename)],
    { cwd: scratch },
  );
});
after(() => rmSync(scratch, { recursive: true, force: true }));

test('the tarball holds the two builds with their types, the README, and nothing else', () => {
  const files = packed.files.map((f) => f.path).sort();
  for (const entry of ['.', './express', './fastify']) {
    for (const [condition, target] of Object.entries(manifest.exports[entry])) {
      for (const path of Object.values(target)) {
        assert.ok(files.includes(path.slice(2)), `${entry} ${condition}: ${path} is not packed`);
      }
    }
  }
  assert.ok(files.includes('dist/esm/package.json') && files.includes('dist/cjs/package.json'));
  assert.ok(files.includes('README.md') && files.includes('package.json'));
  const stray = files.filter((f) => !/^(dist\/(esm|cjs)\/|README\.md$|package\.json$)/.test(f));
  assert.deepEqual(stray, []);
  assert.equal(packed.name, '@tombstoned/client');
  assert.equal(packed.version, '0.1.0');
});

test('imported as an ES module and required as CommonJS, from the scratch project', async () => {
  const esm = JSON.parse((await run(process.execPath, ['check.mjs'], { cwd: scratch })).stdout);
  const cjs = JSON.parse((await run(process.execPath, ['check.cjs'], { cwd: scratch })).stdout);
  assert.equal(esm.resolved, 'dist/esm/index.js');
  assert.equal(cjs.resolved, 'dist/cjs/index.js');
  delete esm.resolved;
  delete cjs.resolved;
  assert.deepEqual(esm, cjs, 'both builds offer the same');
  assert.ok(esm.exports.includes('Idempotency') && esm.exports.includes('httpAnswer'));
  assert.deepEqual(esm.subpaths, ['function', 'function']);
  assert.deepEqual([esm.key, esm.apiVersion, esm.answers, esm.errors], ['k', 1, [422, '1'], true]);
  const installed = JSON.parse(
    readFileSync(join(scratch, 'node_modules', 'pg', 'package.json'), 'utf8'),
  );
  assert.match(installed.version, /^8\./, 'pg, the peer dependency, is installed with it');
});

test('its .d.ts type-check for both module systems (tsc --noEmit)', async () => {
  const tsc = createRequire(join(root, 'package.json')).resolve('typescript/bin/tsc');
  const checked = await run(process.execPath, [tsc, '-p', join(scratch, 'tsconfig.json')], {
    cwd: scratch,
  }).catch((error) => error);
  assert.equal(checked.code ?? 0, 0, `${checked.stdout}${checked.stderr}`);
});
