// The suite's business: a widget per request_id, its event, its answer, and the business id as
// the second line of defence (the unique constraint widgets_request_id_key).
import { InvalidRequestError } from '@tombstoned/client';

/** The business rows: the widget and its event; `{ id, body }`. */
export async function insertWidget(tx) {
  const { rows } = await tx.query(
    `INSERT INTO public.widgets AS w (tenant_id, principal_id, request_id, name)
     VALUES ($1, $2, $3, $4)
     RETURNING w.widget_id::text AS id, public.widget_body(w) AS body`,
    [tx.scope.tenant, tx.scope.principal, tx.intent.request_id, tx.intent.name],
  );
  const [widget] = rows;
  await tx.enqueueEvent(widget.id, 'widget.created', widget.body);
  return widget;
}

/** The business write: the widget, its event, and the answer stored by `complete`. */
export async function writeWidget(tx) {
  const widget = await insertWidget(tx);
  return tx.complete(201, widget.body, widget.id);
}

/** The 23505 path: the widget that holds the request_id, and whether it is this request's. */
export const widgetBusinessId = {
  constraint: 'widgets_request_id_key',
  async read(client, scope, intent) {
    const { rows } = await client.query(
      `SELECT w.principal_id = $3 AND w.name = $4 AS same,
              public.widget_body(w)::text AS body, w.widget_id::text AS id
         FROM public.widgets AS w
        WHERE w.tenant_id = $1 AND w.request_id = $2`,
      [scope.tenant, intent.request_id, scope.principal, intent.name],
    );
    return rows.length === 0
      ? null
      : { same: rows[0].same, bodyText: rows[0].body, resourceId: rows[0].id };
  },
};

/** The normalised intent of a request body: `{ v, request_id, name }`, or a 400. */
export function widgetIntent(body) {
  const doc = body ?? {};
  for (const field of ['request_id', 'name']) {
    const value = doc[field];
    if (typeof value !== 'string' || value.length < 1 || value.length > 100) {
      throw new InvalidRequestError(`${field}: a string of 1 to 100 characters`);
    }
  }
  return { v: 1, request_id: doc.request_id, name: doc.name };
}
