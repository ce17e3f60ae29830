#!/usr/bin/env bash
# What the SQL API's operation check (migration V8, issue 36) costs a service: pgbench, one
# client, against the schema just before V8 and the current one on the same throwaway cluster,
# alternating (5 runs of 5 s each, per script and schema), as a role with the documented grants
# (and, on the current schema, its operation). Prints the medians and their ratio.
#
#   bench/operation_check.sh                      # PostgreSQL from /usr/lib/postgresql/*/bin
#   PGBIN=/path/to/bin bench/operation_check.sh
#
# Scripts: `claim` (claim a new key, complete, commit) and `replay` (claim a key that exists:
# the stored answer). synchronous_commit is off, so the figures are the statements' CPU, not the
# disk's flushes. Run as root (the cluster runs as `postgres`) or as the cluster's user.
set -euo pipefail
cd "$(dirname "$0")/.."
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
port=55433
dir=$(mktemp -d /tmp/tombstoned-operation-check.XXXXXX)
as_owner() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" -eq 0 ] && chown postgres "$dir"
cleanup() { as_owner "$PGBIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
as_owner "$PGBIN/initdb" -D "$dir/data" -U postgres -A trust >/dev/null
as_owner "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
    -o "-p $port -k $dir -c synchronous_commit=off -c shared_buffers=256MB" start >/dev/null
psql="psql -h 127.0.0.1 -p $port -U postgres -v ON_ERROR_STOP=1 -q"
cargo build --locked --bin tombstoned -q
$psql -c "CREATE DATABASE before_v8" -c "CREATE DATABASE current" -c "CREATE ROLE svc LOGIN"
# The schema a release before V8 left: its migration files, each in one transaction.
$psql -d before_v8 -c "CREATE SCHEMA tombstoned"
for f in migrations/V*.sql; do
    v=$(basename "$f" | sed 's/^V\([0-9]*\)__.*/\1/')
    [ "$v" -lt 8 ] || continue
    (echo "SET search_path TO tombstoned;"; cat "$f") | $psql -d before_v8 -1 -f - >/dev/null
done
TOMBSTONED_DATABASE_URL="postgresql://postgres@127.0.0.1:$port/current" target/debug/tombstoned migrate >/dev/null 2>&1
for db in before_v8 current; do
    $psql -d "$db" -c "GRANT USAGE ON SCHEMA tombstoned TO svc;
                       GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA tombstoned TO svc"
done
TOMBSTONED_DATABASE_URL="postgresql://postgres@127.0.0.1:$port/current" \
    target/debug/tombstoned operations grant create-payment svc >/dev/null 2>&1
cat > "$dir/claim.sql" <<'EOF'
\set k random(1, 1000000000000)
BEGIN;
SELECT outcome FROM tombstoned.claim('acme', 'billing', 'create-payment', :k || '-' || :client_id, tombstoned.fingerprint('{"a": 1}'), '1 hour');
SELECT tombstoned.complete('acme', 'billing', 'create-payment', :k || '-' || :client_id, 201, '{"ok": true}');
COMMIT;
EOF
cat > "$dir/replay.sql" <<'EOF'
BEGIN;
SELECT outcome FROM tombstoned.claim('acme', 'billing', 'create-payment', 'hot', tombstoned.fingerprint('{"a": 1}'), '1 hour');
COMMIT;
EOF
for db in before_v8 current; do
    pgbench -h 127.0.0.1 -p "$port" -U svc -n -t 1 -f "$dir/claim.sql" "$db" >/dev/null
    psql -h 127.0.0.1 -p "$port" -U svc -d "$db" -q -v ON_ERROR_STOP=1 \
        -c "BEGIN" \
        -c "SELECT 1 FROM tombstoned.claim('acme', 'billing', 'create-payment', 'hot', tombstoned.fingerprint('{\"a\": 1}'), '1 hour')" \
        -c "SELECT 1 FROM tombstoned.complete('acme', 'billing', 'create-payment', 'hot', 201, '{}')" \
        -c "COMMIT" >/dev/null
done
for run in 1 2 3 4 5; do
    for script in claim replay; do
        for db in before_v8 current; do
            tps=$(pgbench -h 127.0.0.1 -p "$port" -U svc -n -c 1 -T 5 -f "$dir/$script.sql" "$db" 2>/dev/null \
                | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
            echo "$script $db $tps"
        done
    done
done | python3 -c '
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in sys.stdin:
    script, db, tps = line.split()
    runs[(script, db)].append(float(tps))
for script in ("claim", "replay"):
    before = statistics.median(runs[(script, "before_v8")])
    now = statistics.median(runs[(script, "current")])
    each = [sorted(round(t) for t in runs[(script, db)]) for db in ("before_v8", "current")]
    print(f"{script:7} before V8 {before:7.0f} tps  current {now:7.0f} tps  "
          f"current/before {now / before:.2f}  (runs: {each[0]} / {each[1]})")
'
