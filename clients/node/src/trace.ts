/**
 * The caller's trace context, for the relay (issue 40): `enqueueEvent` first sets the
 * transaction-local `tombstoned.traceparent` to the W3C `traceparent` of the caller's active
 * OpenTelemetry span, so the relay's delivery of the event continues the caller's trace and the
 * webhook receiver gets a `traceparent` of it. Only when the OpenTelemetry API package
 * (`@opentelemetry/api`, an optional peer dependency) is installed and a valid span is active;
 * otherwise nothing is sent.
 */

/** The setting, for this transaction only (`is_local`): it ends with the COMMIT or ROLLBACK. */
export const SET_TRACEPARENT = "SELECT set_config('tombstoned.traceparent', $1, true)";

type OpenTelemetryApi = typeof import('@opentelemetry/api');

/** The API package, looked for once; `null` when it is not installed. */
let api: Promise<OpenTelemetryApi | null> | undefined;

function openTelemetry(): Promise<OpenTelemetryApi | null> {
  api ??= import('@opentelemetry/api').then(
    (module) => module,
    () => null,
  );
  return api;
}

/** The active OpenTelemetry span as a W3C `traceparent` (version 00), or `null`. */
export async function currentTraceparent(): Promise<string | null> {
  const otel = await openTelemetry();
  const context = otel?.trace.getActiveSpan()?.spanContext();
  if (otel === null || otel === undefined || context === undefined) {
    return null;
  }
  if (!otel.isSpanContextValid(context)) {
    return null;
  }
  const flags = (context.traceFlags & 0xff).toString(16).padStart(2, '0');
  return `00-${context.traceId}-${context.spanId}-${flags}`;
}
