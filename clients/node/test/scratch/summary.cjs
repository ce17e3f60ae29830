// What check.mjs and check.cjs print of the package as each module system loads it: the same
// line, but for the build it resolved to.
exports.summary = (client, express, fastify, resolved) => {
  const busy = new client.InProgressError('busy', { sqlstate: '55P03' });
  return JSON.stringify({
    resolved: resolved.replace(/.*\/dist\//, 'dist/'),
    exports: Object.keys(client).sort(),
    subpaths: [typeof express.idempotent, typeof fastify.idempotent],
    key: express.readIdempotencyKey(['k']),
    apiVersion: client.API_VERSION,
    answers: [
      client.httpAnswer(new client.KeyReused()).status,
      client.httpAnswer(busy).headers['Retry-After'],
    ],
    errors: busy instanceof client.TombstonedError && busy.name === 'InProgressError',
  });
};
