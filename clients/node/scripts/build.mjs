// Compiles src/ twice: ES modules into dist/esm, CommonJS into dist/cjs, each with its .d.ts and
// a package.json that tells Node (and TypeScript) which module system the directory holds.
// Run by `npm run build`, by `npm pack` (prepack) and by clients/setup.
import { execFileSync } from 'node:child_process';
import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');

// Built beside dist/ and then put in its place, so a process loading the package meanwhile (an
// example under test) never finds it half written.
const next = join(root, 'dist.next');
rmSync(next, { recursive: true, force: true });
for (const [config, dir, type] of [
  ['tsconfig.esm.json', 'esm', 'module'],
  ['tsconfig.cjs.json', 'cjs', 'commonjs'],
]) {
  const outDir = join(next, dir);
  execFileSync(process.execPath, [tsc, '-p', join(root, config), '--outDir', outDir], {
    stdio: 'inherit',
  });
  mkdirSync(outDir, { recursive: true });
  writeFileSync(join(outDir, 'package.json'), `${JSON.stringify({ type })}\n`);
}
rmSync(join(root, 'dist'), { recursive: true, force: true });
renameSync(next, join(root, 'dist'));
