//! The pgbench scripts of scenario 4 (`bench/pgbench/*.sql`), generated from the product's own
//! statements (`tombstoned::claim::sql`) so pgbench runs the very same SQL transactions as the
//! API: the statement texts verbatim, each `$n` replaced by a pgbench variable, and the same
//! pipelining (BEGIN; set lock_timeout; the statement; COMMIT in one round trip).
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

/// `set_lock_timeout`'s parameter.
const LOCK_PARAMS: [&str; 1] = ["lock_timeout"];

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

/// A transaction pipelined like the claim's (`db::pipeline`): BEGIN, the settings, the statement,
/// COMMIT.
fn pipeline(settings: &str, statement: &str) -> String {
    format!(
        "\\startpipeline\n{};\n{};\n{};\n{};\n\\endpipeline\n",
        sql::BEGIN,
        substitute(settings, &LOCK_PARAMS),
        statement,
        sql::COMMIT
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
-- A claim of a new key exactly as the API runs it (docs/api.md, \"The SQL\"): BEGIN, the
-- lock_timeout, claim_and_create, COMMIT, pipelined in one round trip. Needs -M prepared.
-- The first query makes the new key and ids (pgbench cannot make strings; the API makes them
-- in-process): one extra round trip that scenario 4 measures alone (uuids.sql) and reports.
-- Constants (-D): lock_timeout operation fingerprint amount_minor amount currency item quantity
-- recipient window_us metadata.
{UUIDS}{}",
        pipeline(
            sql::SET_LOCK_TIMEOUT,
            &substitute(qualify(sql::CLAIM_AND_CREATE, SCHEMA), &CLAIM_PARAMS)
        )
    )
}

fn replay_script() -> String {
    format!(
        "{HEADER}--
-- A replay exactly as the API runs it for an existing key inside its window: the claim
-- transaction, whose statement finds the key in its snapshot, inserts nothing and reads the
-- body FOR SHARE (asynchronous commit), pipelined in one round trip. Needs -M prepared.
-- Keys of the replay set are decimal numbers (pgbench can only make integers); its records
-- carry the fingerprint pgbench sends (-D fingerprint), as the API's replays carry theirs.
-- Constants (-D): replay_keys tenant principal, and claim.sql's constants plus request_id,
-- order_id and event_id (never inserted: the key exists).
\\set n random(1, :replay_keys)
\\set key {DECIMAL_KEY_BASE} + :n
{}",
        pipeline(
            sql::SET_LOCK_TIMEOUT,
            &substitute(qualify(sql::CLAIM_AND_CREATE, SCHEMA), &CLAIM_PARAMS)
        )
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
