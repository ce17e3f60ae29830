#!/usr/bin/env python3
"""What a Sync costs PostgreSQL: one pipelined transaction sent with one Sync, against the same
transaction with a Sync after every statement (what tokio-postgres sends, and so the daemon).

An experiment behind BENCHMARKS.md "Round 3: performance" (issue 28, target 2), not one of the
scenarios: it isolates the protocol's share of PostgreSQL's CPU per replay from everything else
that differs between the API and pgbench. The transaction is a replay's shape on a table of its
own: BEGIN READ COMMITTED, set_config('lock_timeout'), a primary-key read FOR SHARE, COMMIT.
Statements are prepared once per session and sent through libpq's pipeline mode, as pgbench
-M prepared sends them; a "Sync" is libpq's PQpipelineSync, which also flushes, so the Sync-each
mode writes four times where tokio-postgres writes once (the client's cost; the server's is
what is read). The two modes alternate; PostgreSQL's CPU is read from /proc (user + system time of
every process of the cluster) around the measured seconds only.

    examples/setup     # once: the examples' Python venv, with psycopg
    examples/python-payments/.venv/bin/python bench/syncs.py postgresql://postgres@127.0.0.1:5432/postgres

Arguments after the URL: clients (16), seconds per trial (5), repetitions (3). Run it on a
server on this host (it reads the server's processes from /proc) and as root or the server's
user. It creates and drops the table `sync_probe`.
"""

import multiprocessing as mp
import os
import random
import statistics
import sys
import time

import psycopg
from psycopg import pq

ROWS = 100_000
STATEMENTS = [
    (b"BEGIN ISOLATION LEVEL READ COMMITTED", lambda: []),
    (b"SELECT set_config('lock_timeout', $1, true)", lambda: [b"2s"]),
    (b"SELECT v FROM sync_probe WHERE id = $1::int FOR SHARE",
     lambda: [str(random.randrange(ROWS)).encode()]),
    (b"COMMIT", lambda: []),
]


def cluster_cpu_seconds(postmaster_pid):
    """User + system seconds of the postmaster and its children (the backends, the writers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid = int(fields[1])
        if int(pid) == postmaster_pid or ppid == postmaster_pid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def client(url, mode, ready, start, stop, done):
    with psycopg.connect(url, autocommit=True) as conn:
        pg = conn.pgconn
        for i, (sql, _) in enumerate(STATEMENTS):
            check(pg.prepare(b"s%d" % i, sql), pq.ExecStatus.COMMAND_OK)
        pg.enter_pipeline_mode()
        for _ in range(10):  # warm up
            run(pg, mode)
        ready.wait()
        start.wait()
        n = 0
        while not stop.is_set():
            run(pg, mode)
            n += 1
        done.put(n)
        ready.wait()  # keep the session open until the CPU has been read
        pg.exit_pipeline_mode()


def check(result, status):
    if result.status != status:
        raise RuntimeError(f"{result.status}: {result.error_message!r}")


def run(pg, mode):
    """One transaction: the four prepared statements sent without waiting, then every result."""
    syncs = 0
    for i, (_, params) in enumerate(STATEMENTS):
        pg.send_query_prepared(b"s%d" % i, params())
        if mode == "sync-each":
            pg.pipeline_sync()
            syncs += 1
    if mode == "sync-once":
        pg.pipeline_sync()
        syncs = 1
    results = seen_syncs = 0
    while seen_syncs < syncs:
        r = pg.get_result()
        if r is None:
            continue
        if r.status == pq.ExecStatus.PIPELINE_SYNC:
            seen_syncs += 1
        elif r.status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            results += 1
        else:
            raise RuntimeError(f"{r.status}: {r.error_message!r}")
    if results != len(STATEMENTS):
        raise RuntimeError(f"{results} results for {len(STATEMENTS)} statements")


def trial(url, mode, clients, seconds, postmaster_pid):
    ready, start = mp.Barrier(clients + 1), mp.Barrier(clients + 1)
    stop, done = mp.Event(), mp.Queue()
    procs = [
        mp.Process(target=client, args=(url, mode, ready, start, stop, done))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    ready.wait()
    cpu0 = cluster_cpu_seconds(postmaster_pid)
    start.wait()
    t0 = time.monotonic()
    time.sleep(seconds)
    stop.set()
    transactions = sum(done.get() for _ in procs)
    elapsed = time.monotonic() - t0
    cpu1 = cluster_cpu_seconds(postmaster_pid)
    ready.wait()
    for p in procs:
        p.join()
    return transactions / elapsed, (cpu1 - cpu0) * 1e6 / max(transactions, 1)


def main():
    url = sys.argv[1]
    clients = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 5
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    with psycopg.connect(url, autocommit=True) as conn:
        postmaster_pid = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"
        ).fetchone()[0]
        # the checkpointer's parent is the postmaster
        with open(f"/proc/{postmaster_pid}/stat") as f:
            postmaster_pid = int(f.read().rsplit(")", 1)[1].split()[1])
        conn.execute("DROP TABLE IF EXISTS sync_probe")
        conn.execute("CREATE TABLE sync_probe (id int PRIMARY KEY, v text NOT NULL)")
        conn.execute(
            "INSERT INTO sync_probe SELECT i, md5(i::text) FROM generate_series(0, %s) AS i",
            (ROWS - 1,),
        )
        conn.execute("VACUUM ANALYZE sync_probe")
    results = {"sync-once": [], "sync-each": []}
    modes = list(results)
    for rep in range(reps):
        for mode in modes if rep % 2 == 0 else reversed(modes):
            tps, cpu = trial(url, mode, clients, seconds, postmaster_pid)
            results[mode].append((tps, cpu))
            print(f"rep {rep} {mode:9} {tps:8.0f} tx/s, PostgreSQL CPU {cpu:6.1f} µs/tx", flush=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE sync_probe")
    med = {m: (statistics.median(t for t, _ in r), statistics.median(c for _, c in r))
           for m, r in results.items()}
    once, each = med["sync-once"], med["sync-each"]
    print(f"medians of {reps}, {clients} clients: one Sync {once[0]:.0f} tx/s, {once[1]:.1f} µs/tx; "
          f"a Sync per statement {each[0]:.0f} tx/s, {each[1]:.1f} µs/tx; "
          f"CPU ratio {each[1] / once[1]:.2f}, {(each[1] - once[1]) / 3:.1f} µs per extra Sync")


if __name__ == "__main__":
    main()
