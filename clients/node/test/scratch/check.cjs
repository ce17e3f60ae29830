// The package as a CommonJS requirer sees it (test/package.test.js runs this in a scratch
// project that installed the packed tarball).
const client = require('@tombstoned/client');
const express = require('@tombstoned/client/express');
const fastify = require('@tombstoned/client/fastify');
const { summary } = require('./summary.cjs');

console.log(summary(client, express, fastify, require.resolve('@tombstoned/client')));
