//! The pgbench scripts of scenario 4 (`bench/pgbench/*.sql`), generated from the product's own
//! statements (`tombstoned::claim::sql`) so pgbench runs the very same SQL transactions as the
//! API: the statement texts verbatim, each `$n` replaced by a pgbench variable, and the same
//! shape — the claim statement alone, one implicit transaction, on sessions that carry the lock
//! timeout ([`SESSION_OPTIONS`]) and the server's READ COMMITTED, as the API's pooled sessions
//! carry them (`tombstoned::db::pooled`).
//!
//! The files are kept in the repository; the benchmark refuses to run when they differ from what
//! this module generates, and so does `tests/it/bench_scripts.rs`.
//! Regenerate with `cargo bench --bench scenarios -- --write-pgbench-scripts`.

use std::path::Path;

use tombstoned::claim::sql;
use tombstoned::db::sql::qualify;

/// The schema the benchmark migrates (its statements name it, as the daemon's do).
const SCHEMA: &str = "tombstoned";

/// `claim_and_create`'s parameters, in order (docs in `tombstoned::claim::sql::CLAIM_AND_CREATE`).
const CLAIM_PARAMS: [&str; 16] = [
    "tenant",
    "principal",
    "operation",
    "key",
    "fingerprint",
    "order_id",
    "request_id",
    "amount_minor",
    "amount",
    "currency",
    "item",
    "quantity",
    "recipient",
    "window_us",
    "event_id",
    "metadata",
];

/// `api.claim_lock_timeout` (the default) as the API sends it: pgbench's, the floor's and the
/// benchmark daemon's.
pub const LOCK_TIMEOUT: &str = "2000ms";

/// What pgbench's sessions carry, as the API's pooled sessions do (`db::sql::SET_SESSION_SETTINGS`):
/// [`LOCK_TIMEOUT`], as a libpq `options` value (with `search_path`, which the SQL API scripts
/// need). READ COMMITTED is the benchmark server's default.
pub fn session_options() -> String {
    format!("-csearch_path={SCHEMA} -clock_timeout={LOCK_TIMEOUT}")
}

/// Where the decimal keys of the replay set start (`seed::DECIMAL_KEY_BASE`).
pub const DECIMAL_KEY_BASE: i64 = 1_000_000_000_000_000_000;

/// Replaces every `$n` with `:names[n - 1]`.
///
/// # Panics
/// When a placeholder has no name: the statement changed and this table must follow.
pub fn substitute(statement: &str, names: &[&str]) -> String {
    let mut out = String::with_capacity(statement.len() + 64);
    let mut chars = statement.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let mut digits = String::new();
        while let Some((_, d)) = chars.peek() {
            if d.is_ascii_digit() {
                digits.push(*d);
                chars.next();
            } else {
                break;
            }
        }
        let n: usize = digits.parse().expect("`$` followed by a parameter number");
        let name = names
            .get(n - 1)
            .unwrap_or_else(|| panic!("no pgbench variable for ${n}"));
        out.push(':');
        out.push_str(name);
    }
    out
}

/// The claim statement alone, an implicit transaction, as the API sends it on a direct
/// connection (`db::pipeline::in_session`).
fn claim_alone() -> String {
    format!(
        "{};\n",
        substitute(qualify(sql::CLAIM_AND_CREATE, SCHEMA), &CLAIM_PARAMS)
    )
}

/// pgbench cannot make strings: this one query gives each claim its new key, request_id, order
/// id and event id (time-ordered like the API's UUIDv7 ids, so the order and outbox indexes see
/// the same right-edge inserts), and the scope of the client (principal `client_id % 16`, as the
/// API load generator's clients use).
const UUIDS: &str = "\
SELECT gen_random_uuid() AS key, gen_random_uuid() AS request_id,
       (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(random()::text), 1, 19))::uuid AS order_id,
       (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(random()::text), 1, 19))::uuid AS event_id,
       'tenant-' || (:client_id % 16) / 4 AS tenant,
       'principal-' || (:client_id % 16) AS principal \\gset
";

const HEADER: &str = "\
-- GENERATED from tombstoned::claim::sql by
--   cargo bench --bench scenarios -- --write-pgbench-scripts
-- Do not edit: the benchmark and tests/it/bench_scripts.rs fail when this file drifts.
";

fn claim_script() -> String {
    format!(
        "{HEADER}--
-- A claim of a new key exactly as the API runs it on a direct connection (docs/api.md, \"The
-- SQL\"): claim_and_create alone, one implicit transaction, on a session that carries the lock
-- timeout (options {}). Needs -M prepared.
-- The first query makes the new key and ids (pgbench cannot make strings; the API makes them
-- in-process): one extra round trip that scenario 4 measures alone (uuids.sql) and reports.
-- Constants (-D): operation fingerprint amount_minor amount currency item quantity recipient
-- window_us metadata.
{UUIDS}{}",
        session_options(),
        claim_alone()
    )
}

fn replay_script() -> String {
    format!(
        "{HEADER}--
-- A replay exactly as the API runs it for an existing key inside its window: the claim
-- statement alone, one implicit transaction, which finds the key in its snapshot, inserts
-- nothing and reads the body FOR SHARE, on a session that carries the lock timeout (options
-- {}). Needs -M prepared.
-- Keys of the replay set are decimal numbers (pgbench can only make integers); its records
-- carry the fingerprint pgbench sends (-D fingerprint), as the API's replays carry theirs.
-- Constants (-D): replay_keys tenant principal, and claim.sql's constants plus request_id,
-- order_id and event_id (never inserted: the key exists).
\\set n random(1, :replay_keys)
\\set key {DECIMAL_KEY_BASE} + :n
{}",
        session_options(),
        claim_alone()
    )
}

fn uuids_script() -> String {
    format!(
        "{HEADER}--
-- claim.sql's first query alone: what the extra round trip costs pgbench.
{UUIDS}"
    )
}

/// `(file name, content)` of every script.
pub fn scripts() -> Vec<(&'static str, String)> {
    vec![
        ("claim.sql", claim_script()),
        ("replay.sql", replay_script()),
        ("uuids.sql", uuids_script()),
    ]
}

/// Fails unless every script in `dir` is exactly what [`scripts`] generates.
pub fn check_files(dir: &Path) -> anyhow::Result<()> {
    for (name, text) in scripts() {
        let path = dir.join(name);
        let on_disk = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        anyhow::ensure!(
            on_disk == text,
            "{} differs from tombstoned::claim::sql; regenerate it with \
             `cargo bench --bench scenarios -- --write-pgbench-scripts`",
            path.display()
        );
    }
    Ok(())
}
