// The README's sample route (test/samples.test.js runs it under both adapters): the declaration
// both take, on a table `widgets` with UNIQUE (tenant_id, request_id) and `widget_body()`, the
// one place the answer's JSON is built.
import { InvalidRequestError } from '@tombstoned/client';

export const createWidget = {
  operation: 'create-widget',
  // Who asks: from the app's own authentication, never from the body.
  caller: (req) => req.caller, // { tenant, principal }
  // Before any transaction (a refusal consumes no key): only what changes the result.
  intent: (req) => {
    const { request_id: requestId, name } = req.body ?? {};
    if (typeof requestId !== 'string' || typeof name !== 'string') {
      throw new InvalidRequestError('request_id and name must be strings');
    }
    return { v: 1, request_id: requestId, name };
  },
  // Runs only when this request owns the key, inside its transaction. No remote call here:
  // what must happen elsewhere goes to the outbox.
  handler: async (tx) => {
    const { rows: [widget] } = await tx.query(
      `INSERT INTO widgets AS w (tenant_id, principal_id, request_id, name)
       VALUES ($1, $2, $3, $4)
       RETURNING w.widget_id::text AS id, widget_body(w) AS body`,
      [tx.scope.tenant, tx.scope.principal, tx.intent.request_id, tx.intent.name],
    );
    await tx.enqueueEvent(widget.id, 'widget.created', widget.body);
    return tx.complete(201, widget.body, widget.id);
  },
  resourceUrl: (id) => `/widgets/${id}`,
};
