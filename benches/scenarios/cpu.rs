//! CPU accounting from /proc: who spent the machine's CPU during a trial — PostgreSQL (the
//! postmaster's own time, its live children's, and the time of children it has reaped), the
//! daemon, this process (the load generator) and its reaped children (pgbench), and any one
//! process by its pid (PgBouncer, [`process_seconds`]) — so a throughput difference can be
//! traced to the process that caused it.

use serde::Serialize;

/// Clock ticks per second of /proc's times (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// Cumulative CPU seconds at one instant.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Sample {
    /// PostgreSQL: postmaster + live backends + reaped backends.
    pub postgres: f64,
    /// The daemon under test.
    pub daemon: f64,
    /// This process (load generator).
    pub bench: f64,
    /// This process's reaped children (pgbench, cleanup runs).
    pub children: f64,
    /// The machine, busy.
    pub machine_busy: f64,
    /// The machine, busy + idle.
    pub machine_total: f64,
}

/// CPU seconds spent between two samples.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spent {
    /// PostgreSQL.
    pub postgres: f64,
    /// Daemon.
    pub daemon: f64,
    /// Load generator.
    pub bench: f64,
    /// pgbench.
    pub children: f64,
    /// The whole machine (busy), everyone's included.
    pub machine_busy: f64,
    /// Fraction of the machine's CPU that was idle.
    pub idle_fraction: f64,
}

impl Sample {
    /// Now. `postmaster`: PostgreSQL's postmaster pid, `daemon`: the daemon's pid.
    pub fn take(postmaster: Option<u32>, daemon: Option<u32>) -> Sample {
        let mut s = Sample::default();
        if let Some(pm) = postmaster {
            if let Some(p) = stat(&format!("/proc/{pm}/stat")) {
                s.postgres = p.own + p.children;
            }
            for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                if pid == pm {
                    continue;
                }
                if let Some(p) = stat(&format!("/proc/{pid}/stat")) {
                    if p.ppid == pm {
                        s.postgres += p.own;
                    }
                }
            }
        }
        if let Some(d) = daemon.and_then(|d| stat(&format!("/proc/{d}/stat"))) {
            s.daemon = d.own;
        }
        if let Some(me) = stat("/proc/self/stat") {
            s.bench = me.own;
            s.children = me.children;
        }
        if let Some(line) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| t.lines().next().map(str::to_owned))
        {
            let v: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal ...
            let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
            let total: f64 = v.iter().take(8).sum();
            s.machine_busy = (total - idle) / TICKS;
            s.machine_total = total / TICKS;
        }
        s
    }

    /// What was spent since `earlier`.
    pub fn since(&self, earlier: &Sample) -> Spent {
        let total = self.machine_total - earlier.machine_total;
        let busy = self.machine_busy - earlier.machine_busy;
        Spent {
            postgres: self.postgres - earlier.postgres,
            daemon: self.daemon - earlier.daemon,
            bench: self.bench - earlier.bench,
            children: self.children - earlier.children,
            machine_busy: busy,
            idle_fraction: if total > 0.0 { 1.0 - busy / total } else { 0.0 },
        }
    }
}

/// CPU seconds (user + system) process `pid` has spent so far; 0 when it cannot be read (a
/// process that is gone).
pub fn process_seconds(pid: u32) -> f64 {
    stat(&format!("/proc/{pid}/stat")).map_or(0.0, |s| s.own)
}

struct Stat {
    ppid: u32,
    own: f64,
    children: f64,
}

fn stat(path: &str) -> Option<Stat> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name is in parentheses and may contain spaces: split after the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    Some(Stat {
        ppid: f.get(1)?.parse().ok()?,
        own: (num(11) + num(12)) / TICKS,
        children: (num(13) + num(14)) / TICKS,
    })
}

/// The postmaster's pid, from the first line of `postmaster.pid` in the data directory.
pub fn postmaster_pid(data_dir: Option<std::path::PathBuf>) -> Option<u32> {
    let text = std::fs::read_to_string(data_dir?.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}
