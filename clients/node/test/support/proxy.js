// A TCP proxy in front of PostgreSQL that reads the frontend's messages and, once armed, cuts the
// connection at a chosen one: after forwarding a simple-query COMMIT and before relaying its
// answer (the commit's acknowledgement is lost: the outcome is unknown), or instead of forwarding
// a statement (the connection is lost before COMMIT: nothing was committed).
import net from 'node:net';

/**
 * Listens on a free port of 127.0.0.1 and forwards to `target` ({ host, port }). Once armed with
 * a rule, the rule decides per frontend message (its type and payload text) whether to cut
 * there: 'after' forwards the message first, 'before' does not; undefined relays it.
 */
export async function startProxy(target) {
  const proxy = {
    rule: undefined,
    cuts: 0,
    /** Cut the next connection that sends a message `rule` picks (then disarm). */
    arm(rule) {
      proxy.rule = rule;
    },
  };
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(target.port, target.host);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => {});
    }
    let cut = false;
    let pending = Buffer.alloc(0);
    let startup = true; // the first message (startup) has no type byte
    upstream.on('data', (chunk) => {
      if (!cut) client.write(chunk);
    });
    upstream.on('end', () => client.end());
    client.on('end', () => upstream.end());
    client.on('data', (chunk) => {
      if (cut) return;
      pending = Buffer.concat([pending, chunk]);
      let forward = 0;
      for (;;) {
        const header = startup ? 4 : 5;
        if (pending.length - forward < header) break;
        const length = pending.readInt32BE(forward + header - 4);
        const end = forward + header - 4 + length;
        if (pending.length < end) break;
        const type = startup ? '' : String.fromCharCode(pending[forward]);
        const text = pending.subarray(forward + header, end).toString('utf8');
        startup = false;
        const when = proxy.rule?.(type, text);
        if (when !== undefined) {
          proxy.rule = undefined;
          proxy.cuts += 1;
          cut = true;
          const through = when === 'after' ? end : forward;
          // Both sides are destroyed and nothing of the answer is relayed; the server's side
          // only once the bytes up to the cut are flushed to it (then its end of stream), so
          // the server reads them all — a COMMIT forwarded is a COMMIT done.
          client.destroy();
          upstream.end(pending.subarray(0, through), () => upstream.destroy());
          return;
        }
        forward = end;
      }
      if (forward > 0) {
        upstream.write(pending.subarray(0, forward));
        pending = pending.subarray(forward);
      }
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  proxy.port = server.address().port;
  proxy.close = async () => {
    for (const s of sockets) s.destroy();
    await new Promise((resolve) => server.close(resolve));
  };
  return proxy;
}

/** The rule that cuts right after a simple-query COMMIT is forwarded. */
export const afterCommit = (type, text) =>
  type === 'Q' && /^\s*COMMIT\s*;?\s*\0?$/i.test(text) ? 'after' : undefined;

/** The rule that cuts before the statement whose text contains `fragment` is forwarded. */
export const beforeStatement = (fragment) => (type, text) =>
  (type === 'P' || type === 'Q') && text.includes(fragment) ? 'before' : undefined;
