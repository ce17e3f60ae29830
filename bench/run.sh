#!/usr/bin/env bash
# Runs the benchmark (BENCHMARKS.md) and keeps its output: the table goes to the terminal and to
# target/bench/run-<UTC time>.log, the numbers to target/bench/results.json.
#
#   bench/run.sh                 # full scale, 3 repetitions (~16 min on 2 cores, after the build)
#   bench/run.sh --quick         # small scale, 1 repetition (~2.5 min), what CI runs
#   bench/run.sh --only 1,3 --reps 5
#   bench/run.sh --only 10           # the daemon against the floor of its stack, with per-request
#                                    # profiles (valgrind, strace) in target/bench/profiles/
#   bench/run.sh --database-url postgresql://user@host/db   # a server of yours instead
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target/bench
log="target/bench/run-$(date -u +%Y%m%dT%H%M%SZ).log"
# Build first, so the build's output and time stay out of the log and the measurements.
cargo bench --locked --bench scenarios --no-run
BENCH_MARKDOWN=1 cargo bench --locked --bench scenarios -- "$@" 2>&1 | tee "$log"
echo "log: $log"
