// The package as an ES module importer sees it (test/package.test.js runs this in a scratch
// project that installed the packed tarball).
import * as client from '@tombstoned/client';
import * as express from '@tombstoned/client/express';
import * as fastify from '@tombstoned/client/fastify';

import { summary } from './summary.cjs';

console.log(summary(client, express, fastify, import.meta.resolve('@tombstoned/client')));
