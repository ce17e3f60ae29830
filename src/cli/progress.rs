//! The live progress line of the long runs — `cleanup`, `outbox deliver` and `migrate` — for a
//! person watching a terminal: drawn on stderr by `indicatif`, redrawn a few times a second
//! from what the run reports while it goes on (`cleanup::RunContext::figures`, the relay's
//! tally, the migration's activity), and left at its last state when the run ends, just before
//! the usual report.
//!
//! It appears only when stderr is a terminal, the output is not `--json`, the command was not
//! started by systemd (`INVOCATION_ID`, or a journal stream: `JOURNAL_STREAM`) and `--quiet` was
//! not given ([`wanted`]). Otherwise nothing of this module runs: no extra statement, no line,
//! the logs and the report exactly as without it. Stdout is never touched. While a line is
//! drawn, log lines lift it out of their way ([`LogWriter`]) so neither tears the other.

use std::future::Future;
use std::io::{IsTerminal as _, Write};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a run's figures are read and the line redrawn.
pub(super) const TICK: Duration = Duration::from_millis(100);

/// The line drawn now, if any: the log writer lifts it out of the way of a log line.
static ACTIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn active() -> std::sync::MutexGuard<'static, Option<ProgressBar>> {
    ACTIVE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether a progress line is shown: stderr a terminal, not `--json`, not `--quiet`, not under
/// systemd.
pub(super) fn wanted(json: bool, quiet: bool) -> bool {
    !json && !quiet && std::io::stderr().is_terminal() && !under_systemd()
}

/// Started by systemd: a service's `INVOCATION_ID`, or stderr connected to the journal
/// (`JOURNAL_STREAM`), even through a pseudo-terminal (`systemd-run --pty`).
fn under_systemd() -> bool {
    started_by_systemd(|name| std::env::var_os(name))
}

fn started_by_systemd(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    ["INVOCATION_ID", "JOURNAL_STREAM"]
        .iter()
        .any(|name| var(name).is_some_and(|v| !v.is_empty()))
}

/// A line with a total (`{pos}/{len}`), or, without one, a count alone. `unit` names what is
/// counted ("rows tombstoned").
pub(super) fn counting_style(what: &str, unit: &str, total: bool) -> ProgressStyle {
    ProgressStyle::with_template(&counting_template(what, unit, total))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

fn counting_template(what: &str, unit: &str, total: bool) -> String {
    // The message last, cut to the terminal's width: the counts come first.
    if total {
        format!(
            "{what} {{pos}}/{{len}} {unit} [{{bar:20}}] {{elapsed_precise}}, \
             ~{{eta_precise}} left, {{wide_msg}}"
        )
    } else {
        format!("{what} {{pos}} {unit}, {{elapsed_precise}}, {{wide_msg}}")
    }
}

/// A line of text alone (a migration's activity).
pub(super) fn message_style(what: &str) -> ProgressStyle {
    ProgressStyle::with_template(&message_template(what))
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

fn message_template(what: &str) -> String {
    format!("{what} {{wide_msg}}")
}

/// The line, while it is drawn. Dropped without [`Line::finish`] (a failure, a skipped run), it
/// is cleared, so the one error line stands alone.
pub(super) struct Line {
    bar: ProgressBar,
}

impl Line {
    /// Starts drawing on stderr with `style`, `len` the total when known.
    pub(super) fn start(style: ProgressStyle, len: Option<u64>) -> Line {
        let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr_with_hz(10))
            .with_style(style);
        *active() = Some(bar.clone());
        bar.tick();
        Line { bar }
    }

    /// Sets what the line shows: `pos` (the total grows to it, should more be done than was due
    /// at the start) and `message`.
    pub(super) fn show(&self, pos: u64, message: String) {
        // The message first: the position's change draws both.
        self.bar.set_message(message);
        if self.bar.length().is_some_and(|len| pos > len) {
            self.bar.set_length(pos);
        }
        self.bar.set_position(pos);
    }

    /// Only a message (a line without a count).
    pub(super) fn say(&self, message: String) {
        self.bar.set_message(message);
    }

    /// How long the line has been drawn (the run's time so far, near enough for a rate).
    pub(super) fn elapsed(&self) -> Duration {
        self.bar.elapsed()
    }

    /// `done` per second since the line was started.
    pub(super) fn per_second(&self, done: u64) -> f64 {
        let secs = self.elapsed().as_secs_f64();
        if secs > 0.0 {
            done as f64 / secs
        } else {
            0.0
        }
    }

    /// The run ended: the line is drawn one last time and left on the terminal.
    pub(super) fn finish(self) {
        self.bar.finish();
        // indicatif leaves the cursor at the end of the line: the report starts below it.
        let _ = writeln!(std::io::stderr());
        // Drop clears the registration only.
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        active().take();
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}

/// Runs `work`, calling `tick` every [`TICK`] until it ends (on the same task: nothing is
/// spawned, a single-thread runtime suffices).
pub(super) async fn ticking<F: Future>(work: F, mut tick: impl FnMut()) -> F::Output {
    tokio::pin!(work);
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = every.tick() => tick(),
        }
    }
}

/// The logs' writer: stderr, with the progress line (when one is drawn) lifted out of the way
/// of each log line and drawn again after it. Without a line, it is plain stderr.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LogWriter;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> LogWriter {
        LogWriter
    }
}

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    /// One event's formatted line, written whole.
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let line = active().clone();
        match line {
            Some(bar) => bar.suspend(|| std::io::stderr().write_all(buf)),
            None => std::io::stderr().write_all(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_templates_parse() {
        for template in [
            counting_template("cleanup", "rows tombstoned", true),
            counting_template("cleanup", "rows tombstoned", false),
            message_template("migrate"),
        ] {
            assert!(
                ProgressStyle::with_template(&template).is_ok(),
                "{template}"
            );
        }
    }

    #[test]
    fn systemd_is_told_by_its_variables() {
        let env = |set: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                set.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert!(started_by_systemd(env(&[("INVOCATION_ID", "0123abcd")])));
        assert!(started_by_systemd(env(&[("JOURNAL_STREAM", "8:12345")])));
        assert!(!started_by_systemd(env(&[("INVOCATION_ID", "")])));
        assert!(!started_by_systemd(env(&[("TERM", "xterm")])));
        // Whatever the environment, --json and --quiet turn the line off.
        assert!(!wanted(true, false));
        assert!(!wanted(false, true));
    }
}
