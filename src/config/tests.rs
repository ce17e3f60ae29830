//! The configuration's unit tests: precedence, sources, every refusal named, the reload rules held
//! to the fields' docs, and secrets that never print.

use super::*;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use crate::db::settings::DEFAULT_DATABASE_URL;
use crate::db::Pooler;
use crate::money::Currency;
use crate::schedule::Schedule;
use crate::settings::byte_size;

/// The files that hold the sections' typed structs, whose field docs the reload tests read.
const SECTION_SOURCES: &str = concat!(
    include_str!("../db/settings.rs"),
    include_str!("retention.rs"),
    include_str!("cleanup.rs"),
    include_str!("api.rs"),
    include_str!("metrics.rs"),
    include_str!("tracing.rs"),
    include_str!("mod.rs"),
);

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn shipped_example_is_valid_and_matches_the_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/tombstoned.toml");
    let c = Config::load_from(Some(&path), env(&[]), &[]).unwrap();
    let d = Config::load_from(None, env(&[]), &[]).unwrap();
    assert_eq!(c.cleanup, d.cleanup);
    assert_eq!(c.retention, d.retention);
    assert_eq!(c.database.schema, "tombstoned");
    assert_eq!(c.database.pool_size, 16);
    assert_eq!(c.cleanup.batch_size, 1000);
    assert_eq!(c.cleanup.batch_time, None);
    assert_eq!(c.cleanup.schedule.expression(), "*/5 * * * *");
    assert_eq!(c.retention.replay_window, Duration::from_secs(24 * 3600));
    assert_eq!(c.retention.purge_tombstones_after, None);
    assert_eq!(c.retention.outbox_keep_delivered, None);
    assert_eq!(c.outbox, d.outbox);
    assert_eq!(
        c.api.tokens_file,
        path.parent().unwrap().join("tokens.toml")
    );
    assert_eq!(c.api.default_currency.code(), "CNY");
    assert_eq!(c.metrics, d.metrics);
    assert_eq!(
        (
            c.api.max_connections,
            c.api.header_read_timeout,
            c.api.idle_timeout
        ),
        (1024, Duration::from_secs(10), Duration::from_secs(60))
    );
    assert_eq!(
        (
            d.api.max_connections,
            d.api.header_read_timeout,
            d.api.idle_timeout
        ),
        (1024, Duration::from_secs(10), Duration::from_secs(60))
    );
}

#[test]
fn precedence_is_flag_then_env_then_file_then_default() {
    let f = file("[cleanup]\nbatch_size = 10\nlock_timeout = \"1s\"\n");
    let flag = Override {
        section: "cleanup",
        key: "batch_size",
        value: toml::Value::Integer(30),
    };
    let c = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap();
    assert_eq!(c.cleanup.batch_size, 10, "file beats default");
    assert_eq!(
        c.cleanup.statement_timeout,
        Duration::from_secs(30),
        "default"
    );
    let e = env(&[("TOMBSTONED_CLEANUP__BATCH_SIZE", "20")]);
    let c = Config::load_from(Some(f.path()), e.clone(), &[]).unwrap();
    assert_eq!(c.cleanup.batch_size, 20, "env beats file");
    assert_eq!(c.cleanup.lock_timeout, Duration::from_secs(1), "file kept");
    let c = Config::load_from(Some(f.path()), e, &[flag]).unwrap();
    assert_eq!(c.cleanup.batch_size, 30, "flag beats env");
    let twice = env(&[
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "9"),
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
    ]);
    let c = Config::load_from(None, twice, &[]).unwrap();
    assert_eq!(
        c.cleanup.batch_size, 10,
        "a later entry wins, as in an environment"
    );
}

#[test]
fn database_url_sources() {
    use DatabaseUrlOrigin as O;
    let f = file("[database]\nurl = \"postgresql://file@h/db\"\n");
    let no_url = file("[database]\nschema = \"t\"\n");
    let generic = ("DATABASE_URL", "postgresql://generic@h/db");
    let sectioned = ("TOMBSTONED_DATABASE__URL", "postgresql://sectioned@h/db");
    let specific = ("TOMBSTONED_DATABASE_URL", "postgresql://specific@h/db");
    // Highest first: TOMBSTONED_DATABASE_URL, TOMBSTONED_DATABASE__URL, DATABASE_URL (the
    // environment wins over the file, twelve-factor), the file, the default.
    let default = DEFAULT_DATABASE_URL;
    type Case<'a> = (Option<&'a Path>, &'a [(&'a str, &'a str)], &'a str, O);
    let cases: [Case; 7] = [
        (Some(f.path()), &[], "postgresql://file@h/db", O::File),
        (
            Some(f.path()),
            &[generic],
            "postgresql://generic@h/db",
            O::DatabaseUrl,
        ),
        (
            Some(f.path()),
            &[generic, sectioned],
            "postgresql://sectioned@h/db",
            O::SectionVariable,
        ),
        (
            Some(f.path()),
            &[generic, sectioned, specific],
            "postgresql://specific@h/db",
            O::TombstonedDatabaseUrl,
        ),
        (
            None,
            &[generic],
            "postgresql://generic@h/db",
            O::DatabaseUrl,
        ),
        (None, &[], default, O::Default),
        (Some(no_url.path()), &[], default, O::Default),
    ];
    for (path, pairs, url, origin) in cases {
        let c = Config::load_from(path, env(pairs), &[]).unwrap();
        assert_eq!(c.database.url.expose(), url, "{path:?} {pairs:?}");
        assert_eq!(c.database_url_origin, origin, "{path:?} {pairs:?}");
    }
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    let f = file("[cleanup]\nbatchsize = 10\n");
    let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
    assert!(e.to_string().contains("batchsize"), "{e}");
    let f = file("[cleanups]\nbatch_size = 10\n");
    let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
    assert!(e.to_string().contains("cleanups"), "{e}");
    let e =
        Config::load_from(None, env(&[("TOMBSTONED_CLEANUP__BATCHSIZE", "1")]), &[]).unwrap_err();
    assert!(e.to_string().contains("cleanup.batchsize"), "{e}");
    assert!(
        e.to_string().contains("TOMBSTONED_CLEANUP__BATCHSIZE"),
        "{e}"
    );
}

#[test]
fn batch_time_is_off_or_a_duration_from_any_source() {
    let f = file("[cleanup]\nbatch_time = \"50ms\"\n");
    let c = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap();
    assert_eq!(c.cleanup.batch_time, Some(Duration::from_millis(50)));
    let c = Config::load_from(
        Some(f.path()),
        env(&[("TOMBSTONED_CLEANUP__BATCH_TIME", "OFF")]),
        &[],
    )
    .unwrap();
    assert_eq!(
        c.cleanup.batch_time, None,
        "env beats file, \"off\" in any case"
    );
}

#[test]
fn bad_values_are_named() {
    let cases = [
        (
            "[cleanup]\nlock_timeout = \"5 parsecs\"\n",
            "cleanup.lock_timeout",
        ),
        ("[cleanup]\nlock_timeout = \"0s\"\n", "cleanup.lock_timeout"),
        ("[cleanup]\nlock_timeout = \"1m\"\n", "cleanup.lock_timeout"),
        (
            "[cleanup]\nschedule = \"every 5 minutes\"\n",
            "cleanup.schedule",
        ),
        ("[cleanup]\nschedule = \"* * * * 9\"\n", "cleanup.schedule"),
        ("[cleanup]\nbatch_size = 0\n", "cleanup.batch_size"),
        ("[cleanup]\nbatch_time = \"0s\"\n", "cleanup.batch_time"),
        ("[cleanup]\nbatch_time = \"quick\"\n", "cleanup.batch_time"),
        (
            "[cleanup]\nbatch_time = \"30s\"\n",
            "must be shorter than cleanup.statement_timeout",
        ),
        ("[cleanup]\non_locked = \"maybe\"\n", "maybe"),
        (
            "[retention]\npurge_tombstones_after = \"never\"\n",
            "purge_tombstones_after",
        ),
        (
            "[database]\nschema = \"Robert'); DROP\"\n",
            "database.schema",
        ),
        (
            "[api]\ndefault_currency = \"ZZZ\"\n",
            "api.default_currency",
        ),
        (
            "[api]\ndefault_currency = \"XAU\"\n",
            "api.default_currency",
        ),
        (
            "[api]\ndefault_api_version = \"1999-01-01\"\n",
            "api.default_api_version",
        ),
        ("[api]\nlisten = \"localhost\"\n", "api.listen"),
        ("[api]\nmax_connections = 0\n", "api.max_connections"),
        ("[api]\nidle_timeout = \"0s\"\n", "api.idle_timeout"),
        (
            "[metrics]\nheader_read_timeout = \"0s\"\n",
            "metrics.header_read_timeout",
        ),
        ("[cleanup]\nbatch_size = \"ten\"\n", "batch_size"),
    ];
    for (text, needle) in cases {
        let f = file(text);
        let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
        assert!(e.to_string().contains(needle), "{text:?}: {e}");
    }
    let e = Config::load_from(
        None,
        env(&[("TOMBSTONED_CLEANUP__BATCH_SIZE", "lots")]),
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().contains("expected an integer"), "{e}");
}

/// `(key, change)` for every setting, built from typed values: what a reload would see
/// when exactly that key changed in the file.
type Change = (&'static str, fn(&mut Config));

fn one_change_per_key() -> Vec<Change> {
    vec![
        ("database.url", |c| {
            c.database.url = DatabaseUrl::parse("postgresql://other@h/db").unwrap()
        }),
        ("database.schema", |c| c.database.schema = "other".into()),
        ("database.pool_size", |c| c.database.pool_size = 3),
        ("database.connect_timeout", |c| {
            c.database.connect_timeout = Duration::from_secs(9)
        }),
        ("database.password_file", |c| {
            c.database.password_file = Some("/run/pw".into())
        }),
        ("database.pooler", |c| {
            c.database.pooler = Pooler::Transaction
        }),
        ("retention.replay_window", |c| {
            c.retention.replay_window = Duration::from_secs(3600)
        }),
        ("retention.purge_tombstones_after", |c| {
            c.retention.purge_tombstones_after = Some(Duration::from_secs(86400))
        }),
        ("retention.outbox_keep_delivered", |c| {
            c.retention.outbox_keep_delivered = Some(Duration::from_secs(86400))
        }),
        ("cleanup.enabled", |c| c.cleanup.enabled = false),
        ("cleanup.schedule", |c| {
            c.cleanup.schedule = Schedule::parse("0 * * * *").unwrap()
        }),
        ("cleanup.batch_size", |c| c.cleanup.batch_size = 7),
        ("cleanup.batch_time", |c| {
            c.cleanup.batch_time = Some(Duration::from_millis(50))
        }),
        ("cleanup.history_runs", |c| c.cleanup.history_runs = 3),
        ("cleanup.max_replica_lag", |c| {
            c.cleanup.max_replica_lag = Some(1 << 20)
        }),
        ("cleanup.max_rows_per_second", |c| {
            c.cleanup.max_rows_per_second = Some(100)
        }),
        ("cleanup.workers", |c| c.cleanup.workers = 2),
        ("cleanup.lock_timeout", |c| {
            c.cleanup.lock_timeout = Duration::from_secs(1)
        }),
        ("cleanup.statement_timeout", |c| {
            c.cleanup.statement_timeout = Duration::from_secs(60)
        }),
        ("cleanup.on_locked", |c| {
            c.cleanup.on_locked = OnLocked::Skip
        }),
        ("cleanup.max_run_time", |c| {
            c.cleanup.max_run_time = Duration::from_secs(60)
        }),
        ("cleanup.pause_between_batches", |c| {
            c.cleanup.pause_between_batches = Duration::from_secs(1)
        }),
        ("api.enabled", |c| c.api.enabled = false),
        ("api.listen", |c| {
            c.api.listen = SocketAddr::from(([127, 0, 0, 1], 1))
        }),
        ("api.claim_lock_timeout", |c| {
            c.api.claim_lock_timeout = Duration::from_secs(3)
        }),
        ("api.max_body_bytes", |c| c.api.max_body_bytes = 256),
        ("api.default_currency", |c| {
            c.api.default_currency = Currency::parse("JPY").unwrap()
        }),
        ("api.default_api_version", |c| {
            c.api.default_api_version = "0000-00-00".into()
        }),
        ("api.rate_limit_per_second", |c| {
            c.api.rate_limit_per_second = 1
        }),
        ("api.rate_limit_burst", |c| c.api.rate_limit_burst = 1),
        ("api.tokens_file", |c| {
            c.api.tokens_file = "other.toml".into()
        }),
        ("api.max_connections", |c| c.api.max_connections = 7),
        ("api.header_read_timeout", |c| {
            c.api.header_read_timeout = Duration::from_secs(3)
        }),
        ("api.idle_timeout", |c| {
            c.api.idle_timeout = Duration::from_secs(3)
        }),
        ("metrics.listen", |c| {
            c.metrics.listen = SocketAddr::from(([127, 0, 0, 1], 2))
        }),
        ("metrics.max_connections", |c| c.metrics.max_connections = 7),
        ("metrics.header_read_timeout", |c| {
            c.metrics.header_read_timeout = Duration::from_secs(3)
        }),
        ("metrics.idle_timeout", |c| {
            c.metrics.idle_timeout = Duration::from_secs(3)
        }),
        ("outbox.*", |c| c.outbox.batch_size = 7),
        ("tracing.otlp_endpoint", |c| {
            c.tracing.otlp_endpoint = Some("http://127.0.0.1:4318".parse().unwrap())
        }),
        ("tracing.service_name", |c| {
            c.tracing.service_name = "x".into()
        }),
        ("tracing.sample_ratio", |c| c.tracing.sample_ratio = 0.5),
        ("tracing.headers", |c| {
            let raw = toml::from_str::<RawConfig>("[tracing]\nheaders = { a = \"b\" }\n");
            c.tracing.headers = super::validate(raw.unwrap(), Path::new(""))
                .unwrap()
                .tracing
                .headers;
        }),
        ("tracing.ca_file", |c| {
            c.tracing.ca_file = Some("ca.pem".into())
        }),
    ]
}

/// The keys whose field docs in the section files say "Reload: needs a restart", in file order.
fn documented_restart_keys() -> Vec<String> {
    let source = SECTION_SOURCES;
    let mut keys = Vec::new();
    for (section, name) in [
        ("database", "DatabaseConfig"),
        ("retention", "RetentionConfig"),
        ("cleanup", "CleanupConfig"),
        ("api", "ApiConfig"),
        ("metrics", "MetricsConfig"),
        ("tracing", "TracingConfig"),
        ("config", "Config"),
    ] {
        let start = source.find(&format!("pub struct {name} {{")).unwrap();
        let end = start + source[start..].find("\n}\n").unwrap();
        let mut doc = String::new();
        for line in source[start..end].lines().skip(1) {
            let line = line.trim();
            if let Some(text) = line.strip_prefix("///") {
                doc.push_str(text);
                doc.push(' ');
                continue;
            }
            let Some(field) = line.strip_prefix("pub ").and_then(|l| l.split(':').next()) else {
                continue;
            };
            let doc = std::mem::take(&mut doc);
            let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
            if section == "config" {
                if field == "outbox" {
                    assert!(doc.contains("Reload: needs a restart"), "outbox: {doc}");
                    keys.push("outbox.*".to_owned());
                }
                continue;
            }
            assert!(
                doc.contains("Default: "),
                "{section}.{field} names no default"
            );
            let restart = doc.contains("Reload: needs a restart");
            assert!(
                restart || doc.contains("Reload: applied"),
                "{section}.{field} says neither whether a reload applies it"
            );
            if restart {
                keys.push(format!("{section}.{field}"));
            }
        }
    }
    keys
}

#[test]
fn restart_required_changes_is_what_the_field_docs_say() {
    let running = Config::default();
    let changes = one_change_per_key();
    let documented = documented_restart_keys();
    assert_eq!(documented.len(), 20, "{documented:?}");
    for (key, change) in &changes {
        let mut new = running.clone();
        change(&mut new);
        let expected: Vec<&str> = if documented.iter().any(|d| d == key) {
            vec![key]
        } else {
            vec![]
        };
        assert_eq!(running.restart_required_changes(&new), expected, "{key}");
        // A reload keeps the restart-only value and applies the rest.
        let applied = running.reloaded(new.clone());
        assert!(
            running.restart_required_changes(&applied).is_empty(),
            "{key}"
        );
        if expected.is_empty() {
            assert_eq!(format!("{applied:?}"), format!("{new:?}"), "{key}");
        }
    }
    // Every field is covered by a change above.
    let fields: usize = documented_field_count();
    assert_eq!(
        changes.len(),
        fields + 1,
        "one change per key, outbox as one"
    );
}

fn documented_field_count() -> usize {
    let source = SECTION_SOURCES;
    [
        "DatabaseConfig",
        "RetentionConfig",
        "CleanupConfig",
        "ApiConfig",
        "MetricsConfig",
        "TracingConfig",
    ]
    .iter()
    .map(|name| {
        let start = source.find(&format!("pub struct {name} {{")).unwrap();
        let end = start + source[start..].find("\n}\n").unwrap();
        source[start..end]
            .lines()
            .filter(|l| l.trim_start().starts_with("pub "))
            .count()
            - 1
    })
    .sum()
}

#[test]
fn a_reload_names_and_keeps_every_restart_only_setting() {
    let running = Config::default();
    let mut new = running.clone();
    let mut restart_keys = Vec::new();
    for (key, change) in one_change_per_key() {
        change(&mut new);
        let mut alone = running.clone();
        change(&mut alone);
        if !running.restart_required_changes(&alone).is_empty() {
            restart_keys.push(key);
        }
    }
    assert_eq!(running.restart_required_changes(&new), restart_keys);
    assert!(running
        .restart_required_changes(&running.clone())
        .is_empty());

    let applied = running.reloaded(new);
    assert!(running.restart_required_changes(&applied).is_empty());
    assert_eq!(applied.cleanup.batch_size, 7);
    assert_eq!(applied.retention.replay_window, Duration::from_secs(3600));
    assert_eq!(applied.api.claim_lock_timeout, Duration::from_secs(3));
    assert_eq!(applied.api.default_currency.code(), "JPY");
}

#[test]
fn loading_nothing_gives_the_typed_defaults() {
    let loaded = Config::load_from(None, env(&[]), &[]).unwrap();
    assert_eq!(format!("{loaded:?}"), format!("{:?}", Config::default()));
    // And the raw defaults read back as the typed ones, key by key, through the same
    // validation a file takes.
    let raw = toml::to_string(&RawConfig::default()).unwrap();
    let f = file(&raw);
    let from_file = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap();
    let from_file = Config {
        source: None,
        database_url_origin: DatabaseUrlOrigin::Default,
        tracing_origins: TracingOrigins::default(),
        api: ApiConfig {
            tokens_file: PathBuf::from("tokens.toml"),
            ..from_file.api
        },
        ..from_file
    };
    assert_eq!(format!("{from_file:?}"), format!("{:?}", Config::default()));
}

#[test]
fn validation_names_every_problem_at_once() {
    let f = file(
        "[database]\npool_size = 0\n[cleanup]\nbatch_size = 0\nlock_timeout = \"0s\"\n\
         [api]\ndefault_currency = \"ZZZ\"\nlisten = \"localhost\"\n",
    );
    let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
    let keys = e.invalid_keys();
    assert_eq!(
        keys,
        [
            "database.pool_size",
            "cleanup.lock_timeout",
            "cleanup.batch_size",
            "api.default_currency",
            "api.listen"
        ]
    );
    let shown = e.to_string();
    assert!(
        shown.starts_with("5 problems: invalid value for `database.pool_size`"),
        "{shown}"
    );
    // A combined check does not pile onto a key already refused.
    assert!(
        !shown.contains("shorter than cleanup.statement_timeout"),
        "{shown}"
    );
    // One problem stays the error it always was.
    let f = file("[cleanup]\nbatch_size = 0\n");
    let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
    assert!(
        matches!(
            e,
            ConfigError::Invalid {
                key: "cleanup.batch_size",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn durations_postgresql_cannot_hold_are_refused_naming_the_key() {
    for (text, key) in [
        (
            "[retention]\nreplay_window = \"300000years\"\n",
            "retention.replay_window",
        ),
        (
            "[retention]\nreplay_window = \"5001years\"\n",
            "retention.replay_window",
        ),
        (
            "[retention]\npurge_tombstones_after = \"7000years\"\n",
            "retention.purge_tombstones_after",
        ),
        (
            "[cleanup]\nmax_run_time = \"300000years\"\n",
            "cleanup.max_run_time",
        ),
        (
            "[cleanup]\npause_between_batches = \"300000years\"\n",
            "cleanup.pause_between_batches",
        ),
        (
            "[database]\nconnect_timeout = \"300000years\"\n",
            "database.connect_timeout",
        ),
    ] {
        let f = file(text);
        match Config::load_from(Some(f.path()), env(&[]), &[]) {
            Err(e @ ConfigError::Invalid { .. }) => {
                assert!(e.to_string().contains(key), "{text:?}: {e}")
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
    // The longest accepted retention, in both keys at once.
    let f = file(
        "[retention]\nreplay_window = \"5000years\"\npurge_tombstones_after = \"5000years\"\n",
    );
    let c = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap();
    assert_eq!(c.retention.replay_window, MAX_RETENTION);
    assert_eq!(c.retention.purge_tombstones_after, Some(MAX_RETENTION));
    // ... and what it means: now() + 5000 years (the deadline PostgreSQL computes) and
    // now() - 5000 years (the purge bound) are inside PostgreSQL's and chrono's range.
    let window = chrono::TimeDelta::from_std(MAX_RETENTION).unwrap();
    let now = chrono::Utc::now();
    use chrono::Datelike as _;
    // PostgreSQL: 4713 BC (year -4712 in chrono's astronomical numbering) to 294276 AD;
    // chrono: up to 262143 AD.
    assert!((now + window).year() < 262_143);
    assert!((now - window).year() > -4712);
}

#[test]
fn parse_errors_never_quote_the_line_or_the_value() {
    let secret = "s3cret-Pa55";
    let texts = [
        // An unterminated string on the url line.
        format!("[database]\nurl = \"postgresql://u:{secret}@db/app\npool_size = 4\n"),
        // No quotes at all.
        format!("[database]\nurl = postgresql://u:{secret}@db/app\n"),
        // A bad escape inside the password.
        format!("[database]\nurl = \"postgresql://u:{secret}\\q@db/app\"\n"),
        // The wrong type for a key.
        format!("[database]\npool_size = \"{secret}\"\n"),
        format!("[database]\nurl = [\"{secret}\"]\n"),
        format!("[cleanup]\non_locked = {{ x = \"{secret}\" }}\n"),
    ];
    for text in &texts {
        let f = file(text);
        let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
        let shown = format!("{e} / {e:?}");
        assert!(!shown.contains(secret), "{text:?}: {shown}");
        assert!(matches!(e, ConfigError::Parse { .. }), "{text:?}: {shown}");
        assert!(shown.contains("line 2, column"), "{text:?}: {shown}");
    }
    let f = file(&texts[0]);
    let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("line 2, column 41, key `database.url`: invalid basic string"),
        "{e}"
    );
    // A mistake from the environment names the variable, not its value.
    for var in ["TOMBSTONED_DATABASE__POOL_SIZE", "TOMBSTONED_API__ENABLED"] {
        let e = Config::load_from(None, env(&[(var, secret)]), &[]).unwrap_err();
        assert!(e.to_string().contains(var), "{e}");
        assert!(!format!("{e} {e:?}").contains(secret), "{e}");
    }
}

#[test]
fn byte_sizes_read_as_postgresql_writes_them() {
    let size = |t: &str| byte_size("cleanup.max_replica_lag", t);
    assert_eq!(size("64MB").unwrap(), 64 << 20);
    assert_eq!(size("64 MiB").unwrap(), 64 << 20);
    assert_eq!(size(" 1GB ").unwrap(), 1 << 30);
    assert_eq!(size("1GiB").unwrap(), 1 << 30);
    assert_eq!(size("512kB").unwrap(), 512 << 10);
    assert_eq!(size("2TB").unwrap(), 2 << 40);
    assert_eq!(size("100B").unwrap(), 100);
    for bad in [
        "64",
        "MB",
        "64 mb",
        "0MB",
        "-1MB",
        "1.5GB",
        "64 MB/s",
        "9999999999TB",
        "",
    ] {
        let e = size(bad).unwrap_err().to_string();
        assert!(e.contains("cleanup.max_replica_lag"), "{bad:?}: {e}");
        assert!(e.contains("e.g. \"64MB\""), "{bad:?}: {e}");
    }
    for n in [1u64, 1023, 1024, 64 << 20, 3 << 30, (1 << 40) + 1] {
        let text = byte_size_text(n);
        assert_eq!(size(&text).unwrap(), n, "{text}");
    }
    assert_eq!(byte_size_text(64 << 20), "64MB");
}

#[test]
fn throttle_keys_are_off_by_default_and_read_from_file_and_environment() {
    let d = Config::load_from(None, env(&[]), &[]).unwrap().cleanup;
    assert_eq!((d.max_replica_lag, d.max_rows_per_second), (None, None));
    let f = file("[cleanup]\nmax_replica_lag = \"64MB\"\nmax_rows_per_second = 5000\n");
    let c = Config::load_from(Some(f.path()), env(&[]), &[])
        .unwrap()
        .cleanup;
    assert_eq!(c.max_replica_lag, Some(64 << 20));
    assert_eq!(c.max_rows_per_second, Some(5000));
    let c = Config::load_from(
        Some(f.path()),
        env(&[
            ("TOMBSTONED_CLEANUP__MAX_REPLICA_LAG", "1GB"),
            ("TOMBSTONED_CLEANUP__MAX_ROWS_PER_SECOND", "off"),
        ]),
        &[],
    )
    .unwrap()
    .cleanup;
    assert_eq!(c.max_replica_lag, Some(1 << 30));
    assert_eq!(c.max_rows_per_second, None);
    let c = Config::load_from(
        None,
        env(&[("TOMBSTONED_CLEANUP__MAX_ROWS_PER_SECOND", "250")]),
        &[],
    )
    .unwrap()
    .cleanup;
    assert_eq!(c.max_rows_per_second, Some(250));
    let f = file("[cleanup]\nmax_replica_lag = \"off\"\nmax_rows_per_second = \"off\"\n");
    let c = Config::load_from(Some(f.path()), env(&[]), &[])
        .unwrap()
        .cleanup;
    assert_eq!((c.max_replica_lag, c.max_rows_per_second), (None, None));
    for (text, key) in [
        (
            "[cleanup]\nmax_rows_per_second = 0\n",
            "cleanup.max_rows_per_second",
        ),
        (
            "[cleanup]\nmax_rows_per_second = \"fast\"\n",
            "cleanup.max_rows_per_second",
        ),
        (
            "[cleanup]\nmax_replica_lag = \"lots\"\n",
            "cleanup.max_replica_lag",
        ),
    ] {
        let e = Config::load_from(Some(file(text).path()), env(&[]), &[]).unwrap_err();
        assert!(e.to_string().contains(key), "{text:?}: {e}");
    }
}

#[test]
fn purge_accepts_a_duration() {
    let f = file("[retention]\npurge_tombstones_after = \"400d\"\n");
    let c = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap();
    assert_eq!(
        c.retention.purge_tombstones_after,
        Some(Duration::from_secs(400 * 86400))
    );
}

#[test]
fn passwords_never_print() {
    assert_eq!(
        redact_url("postgresql://u:s3cret@db:5432/app?sslmode=disable"),
        "postgresql://u:***@db:5432/app?sslmode=disable"
    );
    assert_eq!(
        redact_url("host=db user=u password=s3cret dbname=app"),
        "host=db user=u password=*** dbname=app"
    );
    assert_eq!(
        redact_url("postgresql://db/app?user=u&password=s3cret&sslmode=disable"),
        "postgresql://u:***@db/app?sslmode=disable"
    );
    assert!(!redact_url("postgresql://db/app?password=s3cret&x=1").contains("s3cret"));
    for raw in [
        "host=db password = s3cret",
        "host=db password= s3cret",
        "host=db password='s3 cret'",
        "host=db PASSWORD=s3cret",
    ] {
        assert!(!redact_url(raw).contains("s3"), "{raw}");
        let shown = match DatabaseUrl::parse(raw) {
            Ok(url) => format!("{url} {url:?}"),
            Err(e) => e.to_string(),
        };
        assert!(!shown.contains("s3"), "{raw}: {shown}");
    }
    let c = Config::load_from(
        None,
        env(&[("DATABASE_URL", "postgresql://u:s3cret@db/app")]),
        &[],
    )
    .unwrap();
    assert!(!format!("{c:?}").contains("s3cret"));
    assert!(!c.database.url.to_string().contains("s3cret"));
}
