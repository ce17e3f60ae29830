#!/usr/bin/env python3
"""Where a cleanup run pays more than the single UPDATE: statement time against time outside the
statements, and (with --perf) the symbols PostgreSQL's processes spend the difference in.

An experiment behind BENCHMARKS.md "The md5 variant" (issue 28, target 6), not one of the
scenarios. On a cluster of yours with initdb's defaults (128 MB shared_buffers, fsync on) and
pg_stat_statements preloaded, it seeds scenario 6's md5 layout once as a template: 300,000
records, ~400-byte bodies, keys md5(i) over 10 tenants x 1,000 principals, deadlines rising with
insertion order, the first 150,000 due. Then, alternating, on a fresh copy each after a
CHECKPOINT: (a) `tombstoned cleanup --json` (the release binary, a fresh process) and (b) one
`UPDATE ... WHERE NOT expired AND replay_deadline <= now()`. For each it reads the wall time
and, from pg_stat_statements, the execution time of the batch statements (a) or of the UPDATE
(b); the rest of (a)'s time is what its transactions cost outside their statements (BEGIN,
settings, the lease renewal, COMMIT, planning, messages, the process).

    examples/setup     # once: the examples' Python venv, with psycopg
    examples/python-payments/.venv/bin/python bench/batch_profile.py \\
        postgresql://postgres@127.0.0.1:5432/postgres target/release/tombstoned 5 [--perf] [--grown]

Arguments: the URL of a superuser's database on that cluster, the tombstoned binary,
repetitions (5). --perf records every process on the machine with `perf record -e cpu-clock -a
-g` during each run (no hardware counters needed) and prints, for the PostgreSQL processes, the
symbols whose samples differ most between (a) and (b), summed over the repetitions. --grown
keeps the indexes as the load's insertions grew them (by default they are rebuilt from sorted
input after the load, as the benchmark's seed builds them). It creates and drops the databases
batch_profile_tpl and batch_profile_run.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

TEMPLATE = "batch_profile_tpl"
RUN = "batch_profile_run"

SEED = """
INSERT INTO tombstoned.idempotency_scopes (tenant_id, principal_id, operation)
SELECT 'tenant-' || (p / 1000), 'principal-' || p, 'create-order'
FROM generate_series(0, 9999) AS p ORDER BY p;
INSERT INTO tombstoned.idempotency_records
    (scope_id, idempotency_key, fingerprint, status_code, response_body, order_id,
     created_at, replay_deadline)
SELECT s.scope_id, md5(i::text), sha256(convert_to('intent/' || i, 'UTF8')), 201,
       jsonb_build_object('order_id', o.id, 'request_id', gen_random_uuid()::text,
           'amount_minor', 100 + (i * 7919) % 1000000, 'amount', '12.34', 'currency', 'CNY',
           'item', (ARRAY['Ergonomic mesh office chair with adjustable lumbar support, black',
                          'Stainless steel insulated water bottle 750 ml, brushed finish',
                          'Noise-cancelling over-ear wireless headphones, 30 h battery',
                          'Organic cotton bath towel set of four, 600 gsm, slate grey'])[1 + i % 4],
           'quantity', 1 + i % 5,
           'recipient', 'Customer ' || (i % 9973) || ' <customer' || (i % 9973) || '@example.com>',
           'status', 'created',
           'created_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')),
       o.id, now() - interval '2 days',
       CASE WHEN i < 150000 THEN now() - interval '1 day' + i * interval '10 ms'
            ELSE now() + interval '10 years' + i * interval '10 ms' END
FROM generate_series(0::bigint, 299999) AS i
CROSS JOIN LATERAL (SELECT gen_random_uuid() AS id) AS o
JOIN tombstoned.idempotency_scopes AS s
  ON s.tenant_id = 'tenant-' || ((i % 10000) / 1000) AND s.principal_id = 'principal-' || (i % 10000)
 AND s.operation = 'create-order'
ORDER BY i;
"""

SINGLE_UPDATE = """
UPDATE tombstoned.idempotency_records
SET response_body = NULL, expired = true, expired_at = now()
WHERE NOT expired AND replay_deadline <= now()"""


def url_for(base, dbname):
    params = conninfo_to_dict(base)
    params["dbname"] = dbname
    return make_conninfo(**params)


def seed(base, binary, grown):
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {RUN}")
        admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
        admin.execute(f"CREATE DATABASE {TEMPLATE}")
    env = dict(os.environ, TOMBSTONED_DATABASE__URL=url_for(base, TEMPLATE))
    subprocess.run([binary, "migrate"], env=env, check=True, capture_output=True)
    with psycopg.connect(url_for(base, TEMPLATE), autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        c.execute(SEED)
        if not grown:
            # Built from sorted input, as the benchmark's seed builds them after its bulk load.
            c.execute("REINDEX TABLE tombstoned.idempotency_records")
        c.execute("VACUUM (FREEZE, ANALYZE) tombstoned.idempotency_records")
        size = c.execute(
            "SELECT pg_size_pretty(pg_total_relation_size('tombstoned.idempotency_records'))"
        ).fetchone()[0]
    print(f"seeded {TEMPLATE}: 300,000 records, 150,000 due, {size}", flush=True)


def fresh_copy(base):
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {RUN}")
        admin.execute(f"CREATE DATABASE {RUN} TEMPLATE {TEMPLATE}")
        admin.execute("CHECKPOINT")


def statement_ms(c, pattern):
    """Execution milliseconds of the statements whose text matches `pattern` (a regex)."""
    return float(
        c.execute(
            "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s AND s.query ~* %s",
            (RUN, pattern),
        ).fetchone()[0]
    )


def perf_start(kind, rep, workdir):
    path = os.path.join(workdir, f"{kind}-{rep}.data")
    proc = subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-a", "-g", "-o", path],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # perf attaches before the run starts
    return proc, path


def perf_symbols(path):
    """Samples per symbol of processes named postgres."""
    out = subprocess.run(
        ["perf", "report", "-i", path, "--comm", "postgres", "--no-children", "--sort", "symbol",
         "-g", "none", "-n", "--stdio"],
        capture_output=True, text=True, check=True).stdout
    samples = Counter()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].endswith("%") and parts[1].isdigit():
            samples[parts[3]] += int(parts[1])
    return samples


def trial(base, binary, kind, rep, workdir):
    fresh_copy(base)
    with psycopg.connect(url_for(base, RUN), autocommit=True) as c:
        c.execute("SELECT pg_stat_statements_reset()")
        recorder = perf_start(kind, rep, workdir) if workdir else None
        start = time.perf_counter()
        if kind == "a":
            env = dict(os.environ, TOMBSTONED_DATABASE__URL=url_for(base, RUN))
            subprocess.run([binary, "cleanup", "--json"], env=env, check=True,
                           capture_output=True)
        else:
            c.execute(SINGLE_UPDATE)
        seconds = time.perf_counter() - start
        symbols = None
        if recorder:
            recorder[0].send_signal(2)
            recorder[0].wait()
            symbols = perf_symbols(recorder[1])
        done = c.execute(
            "SELECT count(*) FROM tombstoned.idempotency_records WHERE expired").fetchone()[0]
        assert done == 150000, done
        executing = statement_ms(c, r"^\s*(WITH picked|UPDATE tombstoned\.idempotency)") / 1000
    return seconds, executing, symbols


def main():
    args = [a for a in sys.argv[1:] if a not in ("--perf", "--grown")]
    base, binary = args[0], args[1]
    reps = int(args[2]) if len(args) > 2 else 5
    workdir = tempfile.mkdtemp(prefix="batch-profile-") if "--perf" in sys.argv else None
    seed(base, binary, "--grown" in sys.argv)
    results = {"a": [], "b": []}
    symbols = {"a": Counter(), "b": Counter()}
    for rep in range(reps):
        for kind in ("a", "b") if rep % 2 == 0 else ("b", "a"):
            seconds, executing, syms = trial(base, binary, kind, rep, workdir)
            results[kind].append((seconds, executing))
            if syms:
                symbols[kind].update(syms)
            print(f"rep {rep} ({kind}): {seconds:.3f} s, of it in the statements {executing:.3f} s",
                  flush=True)
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {RUN}")
        admin.execute(f"DROP DATABASE {TEMPLATE}")
    med = {k: (statistics.median(s for s, _ in v), statistics.median(e for _, e in v))
           for k, v in results.items()}
    (a_s, a_e), (b_s, b_e) = med["a"], med["b"]
    print(f"medians of {reps}: (a) tombstoned cleanup {a_s:.3f} s, statements {a_e:.3f} s, "
          f"outside them {a_s - a_e:.3f} s; (b) the single UPDATE {b_s:.3f} s, "
          f"statement {b_e:.3f} s")
    print(f"rows/s (a) / (b) = {b_s / a_s:.3f}; statement time (b) / (a) = {b_e / a_e:.3f}")
    if workdir:
        total = {k: sum(v.values()) for k, v in symbols.items()}
        print(f"perf samples of postgres processes (cpu-clock, all repetitions): "
              f"(a) {total['a']}, (b) {total['b']}; the symbols that differ most:")
        keys = set(symbols["a"]) | set(symbols["b"])
        for key in sorted(keys, key=lambda k: symbols["b"][k] - symbols["a"][k])[:20]:
            print(f"  {symbols['a'][key] - symbols['b'][key]:+7d}  (a) {symbols['a'][key]:6d}"
                  f"  (b) {symbols['b'][key]:6d}  {key}")


if __name__ == "__main__":
    main()
