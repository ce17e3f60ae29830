//! Scenario 5: storage per key and WAL per tombstoned row.
//!
//! * Per live record: every relation of scenario 1's seeded table (1M live records, vacuumed)
//!   divided by its records.
//! * Per tombstone: scenario 2's table holds the same live records plus 5M tombstones, so
//!   `(size(s2) - size(s1)) / tombstones`, relation by relation (heap with its fillfactor slack
//!   and page overhead, TOAST, each index).
//! * WAL per tombstoned row: a `tombstoned cleanup` run on a fresh copy of scenario 1's data,
//!   right after a CHECKPOINT, with `pg_waldump --stats` over exactly its WAL (records vs
//!   full-page images); then VACUUM and the file sizes of the cleaned table.
//! * V4's layout against this one, side by side in the same run: the same generated records
//!   (200,000 tombstones, then 200,000 live records in the emptied table; 100,000 with
//!   `--quick`) seeded into a database migrated to V4 and into one migrated to the current
//!   schema, loaded and indexed alike, each kind's bytes per row in a table of its own; then
//!   the V5 migration timed on the V4 copy holding both (seconds per million rows).

use anyhow::{Context as _, Result};
use serde::Serialize;
use serde_json::json;
use tokio_postgres::Client;

use crate::cleanup::{trial, Approach};
use crate::report::{check, num, Row, ScenarioResult};
use crate::seed::Layout;
use crate::Bench;

/// Sizes of the table's relations, bytes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sizes {
    /// Heap main fork.
    pub heap: i64,
    /// Free-space map and visibility map.
    pub fsm_vm: i64,
    /// TOAST table and its index.
    pub toast: i64,
    /// Each index, by name.
    pub indexes: Vec<(String, i64)>,
}

impl Sizes {
    /// Everything.
    pub fn total(&self) -> i64 {
        self.heap + self.fsm_vm + self.toast + self.indexes.iter().map(|(_, b)| b).sum::<i64>()
    }

    fn minus(&self, other: &Sizes) -> Sizes {
        Sizes {
            heap: self.heap - other.heap,
            fsm_vm: self.fsm_vm - other.fsm_vm,
            toast: self.toast - other.toast,
            indexes: self
                .indexes
                .iter()
                .map(|(name, b)| {
                    let o = other
                        .indexes
                        .iter()
                        .find(|(n, _)| n == name)
                        .map_or(0, |(_, b)| *b);
                    (name.clone(), b - o)
                })
                .collect(),
        }
    }
}

/// Sizes of `table` (schema-qualified) and its indexes.
pub async fn sizes(client: &Client, table: &str) -> Result<Sizes> {
    let row = client
        .query_one(
            "SELECT pg_relation_size(c.oid, 'main'),
                    pg_relation_size(c.oid, 'fsm') + pg_relation_size(c.oid, 'vm'),
                    coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0)
             FROM pg_class c WHERE c.oid = $1::text::regclass",
            &[&table],
        )
        .await?;
    let indexes = client
        .query(
            "SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
             FROM pg_index i WHERE i.indrelid = $1::text::regclass ORDER BY 1",
            &[&table],
        )
        .await?
        .iter()
        .map(|r| {
            let name: String = r.get(0);
            (
                name.rsplit('.').next().unwrap_or(&name).to_owned(),
                r.get(1),
            )
        })
        .collect();
    Ok(Sizes {
        heap: row.get(0),
        fsm_vm: row.get(1),
        toast: row.get(2),
        indexes,
    })
}

/// Bytes per row, relation by relation.
#[derive(Debug, Clone, Serialize)]
pub struct PerRow {
    /// Heap (main fork).
    pub heap: f64,
    /// FSM + VM.
    pub fsm_vm: f64,
    /// TOAST.
    pub toast: f64,
    /// Each index.
    pub indexes: Vec<(String, f64)>,
    /// All of it.
    pub total: f64,
}

fn per_row(s: &Sizes, rows: i64) -> PerRow {
    let d = rows.max(1) as f64;
    PerRow {
        heap: s.heap as f64 / d,
        fsm_vm: s.fsm_vm as f64 / d,
        toast: s.toast as f64 / d,
        indexes: s
            .indexes
            .iter()
            .map(|(n, b)| (n.clone(), *b as f64 / d))
            .collect(),
        total: s.total() as f64 / d,
    }
}

fn describe(p: &PerRow) -> String {
    let mut parts = vec![format!("heap {}", num(p.heap, 0))];
    if p.toast.abs() >= 0.5 {
        parts.push(format!("toast {}", num(p.toast, 0)));
    }
    for (n, b) in &p.indexes {
        if b.abs() >= 0.5 {
            let short = n.trim_start_matches("idempotency_records_");
            parts.push(format!("{short} {}", num(*b, 0)));
        }
    }
    parts.join(", ")
}

/// `pg_waldump --stats` over one LSN range.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WalStats {
    /// Per resource manager: `(name, records, record bytes, full-page-image bytes)`.
    pub by_rmgr: Vec<(String, u64, u64, u64)>,
    /// Records.
    pub records: u64,
    /// Record bytes (without full-page images).
    pub record_bytes: u64,
    /// Full-page-image bytes.
    pub fpi_bytes: u64,
}

async fn waldump(bench: &Bench, start: &str, end: &str) -> Result<Option<WalStats>> {
    let (Some(bin), Some(data)) = (bench.server.bin_dir(), bench.server.data_dir()) else {
        return Ok(None);
    };
    let tool = bin.join("pg_waldump");
    if !tool.is_file() {
        return Ok(None);
    }
    let output = tokio::process::Command::new(&tool)
        .arg("--stats")
        .arg("-p")
        .arg(data.join("pg_wal"))
        .args(["-s", start, "-e", end])
        .output()
        .await?;
    if !output.status.success() {
        eprintln!(
            "  pg_waldump failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut stats = WalStats::default();
    for line in text.lines() {
        // "Heap      123 ( 12.34)   4567 ( 1.23)   8910 ( 4.56)   13477 ( 2.34)"
        let cleaned = line.replace(['(', ')', '[', ']', '%'], " ");
        let fields: Vec<&str> = cleaned.split_whitespace().collect();
        if fields.len() < 4 || fields[0].starts_with('-') || fields[0] == "Type" {
            continue;
        }
        let nums: Vec<u64> = fields[1..].iter().filter_map(|f| f.parse().ok()).collect();
        // Numbers: N, %, record size, %, FPI size, %, combined, %  (percentages parse as
        // floats, so they are skipped by the u64 parse unless they are whole numbers).
        let ints: Vec<u64> = fields[1..]
            .iter()
            .filter(|f| !f.contains('.'))
            .filter_map(|f| f.parse().ok())
            .collect();
        if ints.len() < 3 || nums.is_empty() {
            continue;
        }
        let (n, rec, fpi) = (ints[0], ints[1], ints[2]);
        if fields[0] == "Total" {
            stats.records = n;
            stats.record_bytes = rec;
            stats.fpi_bytes = fpi;
        } else {
            stats.by_rmgr.push((fields[0].to_owned(), n, rec, fpi));
        }
    }
    Ok(Some(stats))
}

/// The same records in each layout, measured alike: per live record and per tombstone.
#[derive(Debug, Clone, Serialize)]
pub struct LayoutSizes {
    /// Which layout.
    pub layout: Layout,
    /// Bytes per live record, relation by relation (a table of live records only).
    pub live: PerRow,
    /// Bytes per tombstone (a table of tombstones only).
    pub tombstone: PerRow,
    /// Average heap tuple (`pg_column_size` of the row) of a live record and of a tombstone.
    pub tuple_live: f64,
    /// See `tuple_live`.
    pub tuple_tombstone: f64,
}

/// The V5 migration timed on the V4 database: seconds, rows rewritten.
#[derive(Debug, Clone, Serialize)]
pub struct Upgrade {
    /// Rows in the table when V5 ran.
    pub rows: i64,
    /// Wall time of `migrate` (V5 only) on each fresh copy, seconds, sorted.
    pub seconds: Vec<f64>,
    /// Their median.
    pub median_seconds: f64,
    /// The migrated table's sizes afterwards (after VACUUM).
    pub after: Sizes,
}

/// A database migrated to V4 (`layout = V4`, as the release before V5 left it) or to the
/// current schema, named `layout_<layout>`.
async fn layout_db(bench: &mut Bench, layout: Layout) -> Result<(String, Client)> {
    let db = bench
        .server
        .db_name(&format!("layout_{layout:?}").to_lowercase());
    bench.server.create_db(&db).await?;
    match layout {
        Layout::V4 => crate::migrate_to(&bench.server, &db, 4).await?,
        Layout::V5 => crate::migrate(&bench.server, &db).await?,
    }
    let client = bench.server.connect(&db).await?;
    Ok((db, client))
}

/// Scenario 5's side by side: `n` tombstones, then (in the emptied table) `n` live records, in
/// the V4 layout and in the current one, the same generated records seeded the same way (loaded,
/// then indexed, vacuumed); then the V5 migration timed on the V4 copy holding both.
async fn measure_layouts(bench: &mut Bench, n: i64) -> Result<(Vec<LayoutSizes>, Upgrade)> {
    let batch = |tombstones: bool| crate::seed::Batch {
        tag: if tombstones { "t" } else { "l" },
        first: 1,
        last: n,
        deadline0: if tombstones {
            "now() - interval '400 days'".into()
        } else {
            "now() + interval '1 hour'".into()
        },
        step: "60 ms".into(),
        tombstones,
        keys: crate::seed::Keys::Uuid,
    };
    let table = "tombstoned.idempotency_records";
    let tuple_sql = "SELECT avg(pg_column_size(t.*)) FILTER (WHERE NOT expired)::float8,
                            avg(pg_column_size(t.*)) FILTER (WHERE expired)::float8
                     FROM idempotency_records t";
    let mut out = Vec::new();
    let mut upgrade = None;
    for layout in [Layout::V4, Layout::V5] {
        let (db, client) = layout_db(bench, layout).await?;
        // Each kind in a table of its own: added to the other kind, the rows would fill the
        // other's free space (V4's 15 % headroom takes ~6 tombstones per page of live records).
        crate::seed::seed_as(&client, &db, &[batch(true)], layout).await?;
        let tombstones_only = sizes(&client, table).await?;
        let tuple_tombstone: f64 = client.query_one(tuple_sql, &[]).await?.get(1);
        client.batch_execute("TRUNCATE idempotency_records").await?;
        crate::seed::seed_as(&client, &db, &[batch(false)], layout).await?;
        let live_only = sizes(&client, table).await?;
        let tuple_live: f64 = client.query_one(tuple_sql, &[]).await?.get(0);
        out.push(LayoutSizes {
            layout,
            live: per_row(&live_only, n),
            tombstone: per_row(&tombstones_only, n),
            tuple_live,
            tuple_tombstone,
        });
        if layout == Layout::V4 {
            // The upgrade on both kinds: the live records, and the tombstones again; timed on
            // fresh copies, the median of the repetitions.
            crate::seed::seed_as(&client, &db, &[batch(true)], layout).await?;
            drop(client);
            let mut seconds = Vec::new();
            let mut after = Sizes::default();
            for rep in 0..bench.scale.reps.max(3) {
                let copy = bench.server.db_name(&format!("layout_upgrade_{rep}"));
                bench.server.copy_db(&db, &copy).await?;
                let started = std::time::Instant::now();
                crate::migrate(&bench.server, &copy).await?;
                seconds.push(started.elapsed().as_secs_f64());
                let client = bench.server.connect(&copy).await?;
                client.batch_execute("VACUUM idempotency_records").await?;
                after = sizes(&client, table).await?;
                drop(client);
                bench.server.drop_db(&copy).await?;
            }
            seconds.sort_by(f64::total_cmp);
            upgrade = Some(Upgrade {
                rows: 2 * n,
                median_seconds: crate::stats::median(&seconds).unwrap_or(f64::NAN),
                seconds,
                after,
            });
        } else {
            drop(client);
        }
        bench.server.drop_db(&db).await?;
    }
    let upgrade = upgrade.context("the V4 layout is measured first")?;
    Ok((out, upgrade))
}

/// The SQL API's owner path, `claim()` (INSERT) then `complete()` (UPDATE), `n` times at each
/// fillfactor, one session: how many of the UPDATEs were HOT (no new index entries). V5's
/// `fillfactor = 100` leaves a page no room for the new version once it is full.
#[derive(Debug, Clone, Serialize)]
pub struct CompleteHot {
    /// The table's fillfactor for the run.
    pub fillfactor: i32,
    /// UPDATEs (one per claim).
    pub updates: i64,
    /// Of which HOT.
    pub hot: i64,
}

async fn complete_hot(bench: &mut Bench, n: i64) -> Result<Vec<CompleteHot>> {
    let db = bench.server.db_name("complete_hot");
    bench.server.create_db(&db).await?;
    crate::migrate(&bench.server, &db).await?;
    let client = bench.server.connect(&db).await?;
    client
        .batch_execute(
            "CREATE PROCEDURE public.claim_and_complete(n bigint, tag text) LANGUAGE plpgsql AS $$
             BEGIN
                 FOR i IN 1..n LOOP
                     PERFORM tombstoned.claim('t', 'p', 'op', tag || i, sha256((tag || i)::bytea),
                                              '1 hour');
                     PERFORM tombstoned.complete('t', 'p', 'op', tag || i, 201,
                         jsonb_build_object('payment_id', 'pay-' || i, 'amount_minor', i,
                                            'status', 'created', 'note', repeat('x', 200)),
                         'pay-' || i);
                     COMMIT;
                 END LOOP;
             END $$",
        )
        .await?;
    let counters = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
                    WHERE relid = 'tombstoned.idempotency_records'::regclass";
    let mut out = Vec::new();
    for fillfactor in [100, 85] {
        client
            .batch_execute(&format!(
                "TRUNCATE idempotency_records;
                 ALTER TABLE idempotency_records SET (fillfactor = {fillfactor})"
            ))
            .await?;
        let before = client.query_one(counters, &[]).await?;
        let (upd0, hot0): (i64, i64) = (before.get(0), before.get(1));
        let tag = format!("ff{fillfactor}-");
        client
            .execute("CALL public.claim_and_complete($1, $2)", &[&n, &tag])
            .await?;
        // Statistics reach the shared counters when the session goes idle.
        client
            .batch_execute("SELECT pg_stat_force_next_flush()")
            .await?;
        let mut row = client.query_one(counters, &[]).await?;
        for _ in 0..100 {
            if row.get::<_, i64>(0) - upd0 >= n {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            row = client.query_one(counters, &[]).await?;
        }
        out.push(CompleteHot {
            fillfactor,
            updates: row.get::<_, i64>(0) - upd0,
            hot: row.get::<_, i64>(1) - hot0,
        });
    }
    drop(client);
    bench.server.drop_db(&db).await?;
    Ok(out)
}

/// Scenario 5.
pub async fn scenario5(bench: &mut Bench) -> Result<ScenarioResult> {
    let s1 = bench.template("s1").await?;
    let s2 = bench.template("s2").await?;
    let table = "tombstoned.idempotency_records";
    let c1 = bench.server.connect(&s1).await?;
    let c2 = bench.server.connect(&s2).await?;
    let size1 = sizes(&c1, table).await?;
    let size2 = sizes(&c2, table).await?;
    let (t2, l2): (i64, i64) = {
        let r = c2
            .query_one(
                "SELECT count(*) FILTER (WHERE expired), count(*) FILTER (WHERE NOT expired)
                 FROM idempotency_records",
                &[],
            )
            .await?;
        (r.get(0), r.get(1))
    };
    let l1: i64 = c1
        .query_one("SELECT count(*) FROM idempotency_records", &[])
        .await?
        .get(0);
    anyhow::ensure!(l1 == l2, "the difference method needs equal live counts");
    let tuple_live: f64 = c1
        .query_one(
            "SELECT avg(pg_column_size(t.*))::float8 FROM idempotency_records t",
            &[],
        )
        .await?
        .get(0);
    let tuple_tomb: f64 = c2
        .query_one(
            "SELECT avg(pg_column_size(t.*))::float8 FROM idempotency_records t WHERE expired",
            &[],
        )
        .await?
        .get(0);
    drop((c1, c2));
    let live = per_row(&size1, l1);
    let tomb = per_row(&size2.minus(&size1), t2);

    // WAL of a real cleanup run, and the cleaned table's files after VACUUM.
    let run = trial(bench, &s1, Approach::Tombstoned, 99, true).await?;
    let wal = waldump(bench, &run.wal_start, &run.wal_end).await?;
    let cleaned = bench.server.db_name("trial_99_tombstoned");
    let cc = bench.server.connect(&cleaned).await?;
    cc.batch_execute("VACUUM idempotency_records").await?;
    let after_cleanup = sizes(&cc, table).await?;
    drop(cc);
    bench.server.drop_db(&cleaned).await?;
    let wal_per_row = run.wal_bytes as f64 / run.rows.max(1) as f64;

    // The V4 layout and this one side by side, on the same records; the upgrade's time.
    let layout_rows = if bench.scale.quick { 100_000 } else { 200_000 };
    let (layouts, upgrade) = measure_layouts(bench, layout_rows).await?;
    let hot = complete_hot(bench, if bench.scale.quick { 5_000 } else { 20_000 }).await?;

    let quick = bench.scale.quick;
    let mut checks = Vec::new();
    let mut rows = vec![
        Row {
            scenario: 5,
            metric: format!("bytes per live record ({})", describe(&live)),
            baseline: String::new(),
            tombstoned: num(live.total, 0),
            ratio: String::new(),
            pair_ratio: String::new(),
            range: format!("tuple {} B", num(tuple_live, 0)),
            target: String::new(),
            verdict: String::new(),
        },
        Row {
            scenario: 5,
            metric: format!("bytes per tombstone, all-in ({})", describe(&tomb)),
            baseline: String::new(),
            tombstoned: num(tomb.total, 0),
            ratio: String::new(),
            pair_ratio: String::new(),
            range: format!("tuple {} B", num(tuple_tomb, 0)),
            // Issue 13's target (round 1 asked for 200).
            target: "<= 250, else: what shrinks it".into(),
            verdict: check(
                &mut checks,
                5,
                "tombstone <= 250 bytes all-in",
                tomb.total,
                "<= 250",
                tomb.total <= 250.0,
                quick,
            ),
        },
    ];
    if let [v4, v5] = &layouts[..] {
        let pairs = [
            (
                "bytes per tombstone, all-in",
                &v4.tombstone,
                &v5.tombstone,
                v4.tuple_tombstone,
                v5.tuple_tombstone,
            ),
            (
                "bytes per live record, all-in",
                &v4.live,
                &v5.live,
                v4.tuple_live,
                v5.tuple_live,
            ),
        ];
        for (what, old, new, old_tuple, new_tuple) in pairs {
            rows.push(Row {
                scenario: 5,
                metric: format!(
                    "  {what}, V4 layout -> V5 ({layout_rows} of each; V4: {}; V5: {})",
                    describe(old),
                    describe(new)
                ),
                baseline: num(old.total, 0),
                tombstoned: num(new.total, 0),
                ratio: num(new.total / old.total, 2),
                pair_ratio: String::new(),
                range: format!("tuple {} -> {} B", num(old_tuple, 0), num(new_tuple, 0)),
                target: String::new(),
                verdict: String::new(),
            });
        }
    }
    let per_million = upgrade.median_seconds / upgrade.rows.max(1) as f64 * 1e6;
    rows.push(Row {
        scenario: 5,
        metric: format!(
            "  V5 migration (rewrite under ACCESS EXCLUSIVE), seconds per million rows \
             ({} rows: median {} s of {})",
            upgrade.rows,
            num(upgrade.median_seconds, 2),
            upgrade.seconds.len()
        ),
        baseline: String::new(),
        tombstoned: num(per_million, 1),
        ratio: String::new(),
        pair_ratio: String::new(),
        range: String::new(),
        target: String::new(),
        verdict: String::new(),
    });
    for h in &hot {
        rows.push(Row {
            scenario: 5,
            metric: format!(
                "  SQL API complete() UPDATEs that were HOT at fillfactor {} ({} claims, one session)",
                h.fillfactor, h.updates
            ),
            baseline: String::new(),
            tombstoned: format!("{} %", num(100.0 * h.hot as f64 / h.updates.max(1) as f64, 1)),
            ratio: String::new(),
            pair_ratio: String::new(),
            range: String::new(),
            target: String::new(),
            verdict: String::new(),
        });
    }
    rows.push(Row {
        scenario: 5,
        metric: format!(
            "WAL bytes per tombstoned row, cleanup right after a checkpoint{}",
            match &wal {
                Some(w) => format!(
                    " (full-page images {}%, records {} B/row)",
                    num(
                        100.0 * w.fpi_bytes as f64 / (w.fpi_bytes + w.record_bytes).max(1) as f64,
                        0
                    ),
                    num(w.record_bytes as f64 / run.rows.max(1) as f64, 0)
                ),
                None => String::new(),
            }
        ),
        baseline: String::new(),
        tombstoned: num(wal_per_row, 0),
        ratio: String::new(),
        pair_ratio: String::new(),
        range: String::new(),
        target: String::new(),
        verdict: String::new(),
    });
    Ok(ScenarioResult {
        id: 5,
        title: "Storage per key".into(),
        rows,
        checks,
        details: json!({
            "live_records": l1,
            "tombstones": t2,
            "sizes_s1_live_only": size1,
            "sizes_s2_with_tombstones": size2,
            "per_live_record": live,
            "per_tombstone": tomb,
            "avg_tuple_bytes": {"live": tuple_live, "tombstone": tuple_tomb},
            "cleanup_run": run,
            "wal_per_tombstoned_row": wal_per_row,
            "waldump": wal,
            "sizes_after_cleanup_and_vacuum": after_cleanup,
            "layouts": layouts,
            "v5_upgrade": upgrade,
            "sql_api_complete_hot": hot,
        }),
        seconds: 0.0,
    })
}
