//! Per-request profiles of a server process over a fixed number of sequential requests (issue
//! 28): user-space instructions, allocator calls and the top inclusive symbols from callgrind;
//! syscalls by name from `strace -c`; wake-ups from the kernel's per-thread context-switch
//! counters. Counts over a fixed amount of work, so they come out the same on a busy machine.
//!
//! * [`callgrind`]: the server runs under `valgrind --tool=callgrind --instr-atstart=no`
//!   (uninstrumented, so the start-up and the warm-up run at near native speed and count nothing);
//!   after the warm-up instrumentation is switched on (`callgrind_control -i on`), the measured
//!   requests are sent, and the counters dumped (`callgrind_control -d`). Only what ran in between
//!   is in the dump, so self costs are exact (zeroing counters instead, with `-z`, books the
//!   whole total to every frame still on a stack). Instructions are the dump's total `Ir` (all
//!   threads); allocations are the calls to `malloc`, `calloc`, `realloc`, `posix_memalign`,
//!   `aligned_alloc` and `memalign` the dump records (callgrind counts every call edge); the
//!   symbols are `callgrind_annotate --inclusive=yes`'s first lines. The dump and both
//!   annotations (inclusive and self) are kept for reading with `callgrind_annotate` or
//!   KCachegrind.
//! * [`system`]: on the server as it normally runs (not under valgrind): the voluntary and
//!   involuntary context switches of every thread (`/proc/<pid>/task/*/status`) over the
//!   measured requests — a voluntary switch is a thread going to sleep, so one wake-up — then
//!   the same requests again with `strace -c -f -p <pid>` attached, for the syscalls.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context as _, Result};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::floor::find_program;
use crate::http_load::{error_kinds, sequential, Make};

/// The allocator's entry points whose calls count as allocations.
const ALLOCATORS: [&str; 9] = [
    "malloc",
    "calloc",
    "realloc",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "__libc_malloc",
    "__libc_calloc",
    "__libc_realloc",
];

/// How many symbols of each annotation the results keep (the files keep them all). The first
/// inclusive ones are the threads' entry chain and the runtime's poll loop (all of the cost);
/// what the requests do starts below them.
const TOP_SYMBOLS: usize = 40;

/// The programs the profiles need.
#[derive(Debug, Clone)]
pub struct Tools {
    valgrind: PathBuf,
    callgrind_control: PathBuf,
    callgrind_annotate: PathBuf,
    strace: PathBuf,
}

impl Tools {
    /// Finds valgrind, callgrind_control, callgrind_annotate and strace on `PATH`.
    pub fn find() -> Result<Tools> {
        let find = |name: &str| {
            find_program(name).with_context(|| {
                format!(
                    "scenario 10's profiles need `{name}` (Debian: apt-get install valgrind \
                     strace), or run with --no-profiles"
                )
            })
        };
        Ok(Tools {
            valgrind: find("valgrind")?,
            callgrind_control: find("callgrind_control")?,
            callgrind_annotate: find("callgrind_annotate")?,
            strace: find("strace")?,
        })
    }

    /// The command line to start a server under callgrind, its dumps named `out` + `.<pid>…`.
    pub fn callgrind_wrapper(&self, out: &Path) -> Vec<OsString> {
        let mut file = OsString::from("--callgrind-out-file=");
        file.push(out);
        file.push(".%p");
        vec![
            self.valgrind.clone().into_os_string(),
            "--tool=callgrind".into(),
            "--instr-atstart=no".into(),
            "--quiet".into(),
            file,
        ]
    }
}

/// One symbol of an annotation: its cost per request and its share of the total.
#[derive(Debug, Clone, Serialize)]
pub struct Symbol {
    /// Instructions per request (inclusive or self, per the list it is in).
    pub ir_per_request: f64,
    /// Percent of the total.
    pub percent: f64,
    /// `file:function [object]` as callgrind_annotate names it.
    pub name: String,
}

/// What callgrind counted over the measured requests.
#[derive(Debug, Clone, Serialize)]
pub struct CallgrindProfile {
    /// Requests measured.
    pub requests: u64,
    /// Answers that were not the required one.
    pub errors: String,
    /// User-space instructions (Ir, every thread) per request.
    pub instructions_per_request: f64,
    /// Allocator calls per request (see [`ALLOCATORS`]).
    pub allocations_per_request: f64,
    /// Allocator calls per request, by entry point.
    pub allocations_by_function: BTreeMap<String, f64>,
    /// The most expensive symbols, inclusive of their callees.
    pub top_inclusive: Vec<Symbol>,
    /// The most expensive functions by their own instructions (callees excluded), the lines of
    /// one function summed over the source files its inlined code comes from.
    pub top_self: Vec<Symbol>,
    /// Own instructions per request by crate (the function's first path segment; for C
    /// functions such as `memcpy` and `malloc` their object's file name, `libc` for glibc's),
    /// most first: what each part of the stack costs, comparable between daemon and floor.
    pub self_by_crate: Vec<(String, f64)>,
    /// The callgrind dump of the measured requests.
    pub dump: PathBuf,
    /// `callgrind_annotate --inclusive=yes` of it.
    pub inclusive_annotation: PathBuf,
    /// `callgrind_annotate` (self cost) of it.
    pub self_annotation: PathBuf,
}

/// Profiles the server `pid` (started under [`Tools::callgrind_wrapper`] with `out`) at `addr`:
/// `warmup` requests, instrumentation switched on, `requests` measured, dumped and annotated into `dir` as
/// `<label>.callgrind.*`.
#[allow(clippy::too_many_arguments)]
pub async fn callgrind(
    tools: &Tools,
    pid: u32,
    addr: SocketAddr,
    out: &Path,
    make: Make,
    warmup: u64,
    requests: u64,
    dir: &Path,
    label: &str,
) -> Result<CallgrindProfile> {
    sequential(addr, warmup, make.clone()).await?;
    control(tools, pid, "--instr=on").await?;
    let run = sequential(addr, requests, make).await?;
    control(tools, pid, "-d").await?;
    control(tools, pid, "--instr=off").await?;
    let mut produced = out.as_os_str().to_owned();
    produced.push(format!(".{pid}.1"));
    let dump = dir.join(format!("{label}.callgrind.out"));
    tokio::fs::rename(&produced, &dump)
        .await
        .with_context(|| format!("moving the callgrind dump {produced:?}"))?;
    let text = tokio::fs::read_to_string(&dump).await?;
    let total = dump_total(&text).context("no totals in the callgrind dump")?;
    let calls = call_counts(&text);
    let per = |n: u64| n as f64 / requests.max(1) as f64;
    let allocations_by_function: BTreeMap<String, f64> = ALLOCATORS
        .iter()
        .filter_map(|name| calls.get(*name).map(|n| ((*name).to_owned(), per(*n))))
        .collect();
    let inclusive_annotation = dir.join(format!("{label}.callgrind.inclusive.txt"));
    let self_annotation = dir.join(format!("{label}.callgrind.self.txt"));
    let inclusive = annotate(tools, &dump, true).await?;
    tokio::fs::write(&inclusive_annotation, &inclusive).await?;
    let own = annotate(tools, &dump, false).await?;
    tokio::fs::write(&self_annotation, &own).await?;
    let own = by_function(symbols(&own, requests));
    Ok(CallgrindProfile {
        requests,
        errors: error_kinds(&run.errors),
        instructions_per_request: per(total),
        allocations_per_request: allocations_by_function.values().sum(),
        allocations_by_function,
        top_inclusive: symbols(&inclusive, requests)
            .into_iter()
            .take(TOP_SYMBOLS)
            .collect(),
        self_by_crate: by_crate(&own),
        top_self: own.into_iter().take(TOP_SYMBOLS).collect(),
        dump,
        inclusive_annotation,
        self_annotation,
    })
}

/// `callgrind_control <flag> <pid>`; it exits 0 whatever happened, so its answer is checked.
async fn control(tools: &Tools, pid: u32, flag: &str) -> Result<()> {
    let output = tokio::process::Command::new(&tools.callgrind_control)
        .arg(flag)
        .arg(pid.to_string())
        .output()
        .await
        .context("running callgrind_control")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success() && stdout.contains("OK"),
        "callgrind_control {flag} {pid}: {}{}",
        stdout.trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

async fn annotate(tools: &Tools, dump: &Path, inclusive: bool) -> Result<String> {
    let output = tokio::process::Command::new(&tools.callgrind_annotate)
        .arg(format!(
            "--inclusive={}",
            if inclusive { "yes" } else { "no" }
        ))
        .arg("--auto=no")
        // Every symbol, not only those that make up 99 % of the total.
        .arg("--threshold=100")
        .arg(dump)
        .output()
        .await
        .context("running callgrind_annotate")?;
    ensure!(
        output.status.success(),
        "callgrind_annotate failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The dump's `totals:` (or `summary:`) line: every thread's instructions.
fn dump_total(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Calls per callee, summed over every call edge of a callgrind dump (`cfn=` names the callee
/// of the `calls=` line that follows; names are compressed as `(id) name`, then `(id)`).
fn call_counts(text: &str) -> BTreeMap<String, u64> {
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut resolve = |value: &str| -> String {
        let value = value.trim();
        match value.strip_prefix('(').and_then(|v| v.split_once(')')) {
            Some((id, rest)) => {
                let rest = rest.trim();
                if rest.is_empty() {
                    names.get(id).cloned().unwrap_or_default()
                } else {
                    names.insert(id.to_owned(), rest.to_owned());
                    rest.to_owned()
                }
            }
            None => value.to_owned(),
        }
    };
    let mut counts = BTreeMap::new();
    let mut callee = String::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("fn=") {
            resolve(v);
        } else if let Some(v) = line.strip_prefix("cfn=") {
            callee = resolve(v);
        } else if let Some(v) = line.strip_prefix("calls=") {
            let n: u64 = v
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            *counts.entry(callee.clone()).or_insert(0) += n;
        }
    }
    counts
}

/// The symbol lines of a callgrind_annotate report (`1,234 (12.34%)  file:function [obj]`),
/// most expensive first, without the program total.
fn symbols(annotation: &str, requests: u64) -> Vec<Symbol> {
    annotation
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let (count, rest) = line.split_once(' ')?;
            let ir: u64 = count.replace(',', "").parse().ok()?;
            let rest = rest.trim_start();
            let (percent, name) = match rest.strip_prefix('(') {
                Some(r) => {
                    let (p, name) = r.split_once(')')?;
                    (p.trim().trim_end_matches('%').parse().ok()?, name.trim())
                }
                None => (f64::NAN, rest.trim()),
            };
            (!name.starts_with("PROGRAM TOTALS")).then(|| Symbol {
                ir_per_request: ir as f64 / requests.max(1) as f64,
                percent,
                name: name.to_owned(),
            })
        })
        .collect()
}

/// Self costs summed by function: callgrind_annotate gives one line per source file a
/// function's instructions come from (inlined code), `file:function [object]`, the object on the
/// first of them only; the result is named `function [object]`, most expensive first.
/// (Inclusive costs are not summed that way: a caller's lines in several files each include the
/// same callees.)
fn by_function(own: Vec<Symbol>) -> Vec<Symbol> {
    let mut sums: BTreeMap<String, (Symbol, String)> = BTreeMap::new();
    for symbol in own {
        // No ':' in the file names callgrind writes; functions have "::".
        let rest = match symbol.name.split_once(':') {
            Some((_, rest)) => rest,
            None => &symbol.name,
        };
        let (function, object) = match rest.rsplit_once(" [") {
            Some((f, o)) => (f, o.trim_end_matches(']')),
            None => (rest, ""),
        };
        let (sum, known) = sums.entry(function.to_owned()).or_insert_with(|| {
            let zero = Symbol {
                ir_per_request: 0.0,
                percent: 0.0,
                name: function.to_owned(),
            };
            (zero, String::new())
        });
        sum.ir_per_request += symbol.ir_per_request;
        sum.percent += symbol.percent;
        if known.is_empty() {
            object.clone_into(known);
        }
    }
    let mut sums: Vec<Symbol> = sums
        .into_values()
        .map(|(mut sum, object)| {
            if !object.is_empty() {
                sum.name = format!("{} [{object}]", sum.name);
            }
            sum
        })
        .collect();
    sums.sort_by(|a, b| b.ir_per_request.total_cmp(&a.ir_per_request));
    sums
}

/// Sums self costs by crate: the first path segment of the function (`tokio::…`,
/// `<hyper::… as …>` → `hyper`), or, for a C function, its object (`libc` for glibc's).
/// `own`: named `function [object]` ([`by_function`]).
fn by_crate(own: &[Symbol]) -> Vec<(String, f64)> {
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    for symbol in own {
        let (function, object) = match symbol.name.rsplit_once(" [") {
            Some((f, o)) => (f, o.trim_end_matches(']')),
            None => (symbol.name.as_str(), ""),
        };
        let function = function.trim_start_matches(['<', '&', '*', ' ']);
        let name = match function.split_once("::") {
            Some((krate, _)) if !krate.is_empty() && !krate.contains(['<', ' ']) => {
                krate.to_owned()
            }
            _ => match object.rsplit('/').next() {
                Some("libc.so.6") => "libc".to_owned(),
                Some(o) if !o.is_empty() => o.to_owned(),
                _ => "?".to_owned(),
            },
        };
        *sums.entry(name).or_insert(0.0) += symbol.ir_per_request;
    }
    let mut sums: Vec<(String, f64)> = sums.into_iter().collect();
    sums.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    sums
}

/// Syscalls and wake-ups of a normally running server over the measured requests.
#[derive(Debug, Clone, Serialize)]
pub struct SystemProfile {
    /// Requests measured (each of the two runs).
    pub requests: u64,
    /// Answers that were not the required one (both runs).
    pub errors: String,
    /// Voluntary context switches per request (threads going to sleep: wake-ups), every thread.
    pub voluntary_switches_per_request: f64,
    /// Involuntary context switches per request (preemptions).
    pub involuntary_switches_per_request: f64,
    /// Syscalls per request (strace -c, every thread).
    pub syscalls_per_request: f64,
    /// Syscalls per request, by name, most frequent first.
    pub syscalls_by_name: Vec<(String, f64)>,
    /// strace's summary.
    pub strace_summary: PathBuf,
}

/// Profiles the server `pid` at `addr` as it runs: `warmup` requests, then `requests` counted by
/// the kernel's context-switch counters, then `requests` more under `strace -c -f -p`.
#[allow(clippy::too_many_arguments)]
pub async fn system(
    tools: &Tools,
    pid: u32,
    addr: SocketAddr,
    make: Make,
    warmup: u64,
    requests: u64,
    dir: &Path,
    label: &str,
) -> Result<SystemProfile> {
    sequential(addr, warmup, make.clone()).await?;
    let before = switches(pid)?;
    let counted = sequential(addr, requests, make.clone()).await?;
    let after = switches(pid)?;
    let summary = dir.join(format!("{label}.strace.txt"));
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))?.count();
    let mut strace = tokio::process::Command::new(&tools.strace)
        .args(["-c", "-f", "-p"])
        .arg(pid.to_string())
        .arg("-o")
        .arg(&summary)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting strace")?;
    // strace says "Process N attached with K threads" (or "Process N attached" per thread).
    let stderr = strace.stderr.take().context("strace's stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let attached = tokio::time::timeout(Duration::from_secs(20), async {
        let mut attached = 0;
        while attached < threads {
            let Some(line) = lines.next_line().await? else {
                bail!("strace exited before attaching");
            };
            if let Some((_, rest)) = line.split_once("attached with ") {
                attached += rest
                    .split_whitespace()
                    .next()
                    .and_then(|k| k.parse::<usize>().ok())
                    .unwrap_or(1);
            } else if line.contains("attached") {
                attached += 1;
            }
        }
        anyhow::Ok(())
    })
    .await;
    match attached {
        Ok(result) => result?,
        Err(_) => bail!("strace did not attach to the {threads} threads of {pid} within 20 s"),
    }
    let traced = sequential(addr, requests, make).await?;
    if let Some(strace_pid) = strace.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(strace_pid),
            nix::sys::signal::Signal::SIGINT,
        );
    }
    // Drain its stderr ("detached" lines) so it never blocks writing it.
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let status = tokio::time::timeout(Duration::from_secs(20), strace.wait())
        .await
        .context("strace did not stop within 20 s of SIGINT")??;
    let _ = drain.await;
    // strace ends its summary, then dies of the SIGINT it was sent.
    use std::os::unix::process::ExitStatusExt as _;
    ensure!(
        status.success() || status.signal() == Some(nix::libc::SIGINT),
        "strace exited with {status}"
    );
    let calls = strace_calls(&tokio::fs::read_to_string(&summary).await?);
    let per = |n: u64| n as f64 / requests.max(1) as f64;
    let mut by_name: Vec<(String, f64)> = calls.iter().map(|(k, v)| (k.clone(), per(*v))).collect();
    by_name.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut errors = counted.errors.clone();
    for (k, v) in traced.errors {
        *errors.entry(k).or_default() += v;
    }
    Ok(SystemProfile {
        requests,
        errors: error_kinds(&errors),
        voluntary_switches_per_request: per(after.0.saturating_sub(before.0)),
        involuntary_switches_per_request: per(after.1.saturating_sub(before.1)),
        syscalls_per_request: per(calls.values().sum()),
        syscalls_by_name: by_name,
        strace_summary: summary,
    })
}

/// (voluntary, involuntary) context switches of every thread of `pid` now.
fn switches(pid: u32) -> Result<(u64, u64)> {
    let mut total = (0, 0);
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(status) = std::fs::read_to_string(task?.path().join("status")) else {
            continue; // the thread ended
        };
        for line in status.lines() {
            let value = |prefix: &str| {
                line.strip_prefix(prefix)
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            if let Some(v) = value("voluntary_ctxt_switches:") {
                total.0 += v;
            } else if let Some(v) = value("nonvoluntary_ctxt_switches:") {
                total.1 += v;
            }
        }
    }
    Ok(total)
}

/// `strace -c`'s table: calls by syscall name (the rows between the two rules, not the total).
fn strace_calls(summary: &str) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    let mut rules = 0;
    for line in summary.lines() {
        if line.starts_with("------") {
            rules += 1;
            continue;
        }
        if rules != 1 {
            continue;
        }
        // % time, seconds, usecs/call, calls, [errors], syscall
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let (Some(n), Some(name)) = (fields.get(3), fields.last()) {
            if let Ok(n) = n.parse::<u64>() {
                *calls.entry((*name).to_owned()).or_insert(0) += n;
            }
        }
    }
    calls
}
