//! The trace in a log line: while a span is current (tracing on, inside a traced request, run or
//! delivery), every line carries the span's `trace_id` and `span_id` — two more fields at the end
//! of a text line, two more members of a JSON line — so a log line leads to its trace and back.
//! Outside a span, or with tracing off, a line is exactly what the inner format writes.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// An event format with the current span's ids added.
pub(super) struct WithTraceIds<F> {
    inner: F,
    json: bool,
}

impl<F> WithTraceIds<F> {
    /// Around a text format.
    pub(super) fn text(inner: F) -> Self {
        WithTraceIds { inner, json: false }
    }

    /// Around a JSON format (one object per line).
    pub(super) fn json(inner: F) -> Self {
        WithTraceIds { inner, json: true }
    }
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = crate::telemetry::current_ids() else {
            return self.inner.format_event(ctx, writer, event);
        };
        // The line as the inner format writes it, then the ids before its end (a terminal's
        // colours are not kept on such a line).
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        writer.write_str(&with_ids(&line, self.json, &trace_id, &span_id))
    }
}

/// `line` (ending in a newline) with the two ids added.
fn with_ids(line: &str, json: bool, trace_id: &str, span_id: &str) -> String {
    let body = line.strip_suffix('\n').unwrap_or(line);
    match body.strip_suffix('}').filter(|_| json) {
        Some(open) => {
            let separator = if open.trim_end().ends_with('{') {
                ""
            } else {
                ","
            };
            format!("{open}{separator}\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}\n")
        }
        None => format!("{body} trace_id={trace_id} span_id={span_id}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ids_end_a_text_line_and_join_a_json_object() {
        let (t, s) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
        assert_eq!(
            with_ids("2026-01-01 INFO x: done rows=3\n", false, t, s),
            format!("2026-01-01 INFO x: done rows=3 trace_id={t} span_id={s}\n")
        );
        let json = with_ids("{\"level\":\"INFO\",\"message\":\"done\"}\n", true, t, s);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["trace_id"], t);
        assert_eq!(value["span_id"], s);
        assert_eq!(value["message"], "done");
        assert_eq!(
            with_ids("{}\n", true, t, s),
            format!("{{\"trace_id\":\"{t}\",\"span_id\":\"{s}\"}}\n")
        );
    }
}
