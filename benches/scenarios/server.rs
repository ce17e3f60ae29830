//! The PostgreSQL server under test: a throwaway cluster with the benchmark's stated, durable
//! settings (or a server given by URL), and the databases of a run — seeded templates and the
//! per-trial copies made from them so every trial starts from identical bytes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio_postgres::{Client, NoTls};
use tombstoned::pg_cluster::{find_bin_dir, ClusterOptions, ThrowawayCluster};
use tombstoned_testkit::cluster::ClusterOptionsTestExt as _;
use tombstoned_testkit::pgbouncer::{PgBouncer, PoolMode};

/// The server settings every scenario and baseline runs with, and why each differs from the
/// default. Durability is the default's: `fsync`, `synchronous_commit` and `full_page_writes`
/// are on (stated explicitly, because the test clusters turn them off).
pub const SETTINGS: &[(&str, &str, &str)] = &[
    ("fsync", "on", "durable (the default; stated because test clusters turn it off)"),
    ("synchronous_commit", "on", "durable (the default)"),
    ("full_page_writes", "on", "durable (the default)"),
    (
        "shared_buffers",
        "1GB",
        "the 1M-record table and its indexes (~0.9 GB) fit, as on a server sized for its hot set",
    ),
    (
        "max_wal_size",
        "8GB",
        "a 500,000-row cleanup writes ~1 GB of WAL; the 1 GB default starts checkpoints inside runs",
    ),
    (
        "checkpoint_timeout",
        "30min",
        "no timed checkpoint inside a run; each trial starts right after an explicit CHECKPOINT",
    ),
    ("max_connections", "200", "32 pgbench clients or a 32-connection API pool, plus the bench's own"),
    (
        "shared_preload_libraries",
        "pg_stat_statements",
        "per-statement time, buffers and WAL for the profiles",
    ),
    ("pg_stat_statements.track_planning", "on", "planning time per statement"),
    ("track_io_timing", "on", "I/O time in EXPLAIN (ANALYZE, BUFFERS)"),
];

/// The settings of scenario 6's cluster: initdb's defaults (`shared_buffers` 128MB,
/// `max_wal_size` 1GB, `checkpoint_timeout` 5min, ...) except what the profile needs; durability
/// stated as in [`SETTINGS`].
pub const DEFAULT_SCALE_SETTINGS: &[(&str, &str, &str)] = &[
    (
        "fsync",
        "on",
        "durable (the default; stated because test clusters turn it off)",
    ),
    ("synchronous_commit", "on", "durable (the default)"),
    ("full_page_writes", "on", "durable (the default)"),
    (
        "shared_preload_libraries",
        "pg_stat_statements",
        "per-statement time, buffers and WAL for the profiles",
    ),
];

/// One setting as the server reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Setting {
    /// Name.
    pub name: String,
    /// Value with its unit.
    pub value: String,
    /// Where it came from (`command line`, `configuration file`, ...).
    pub source: String,
}

/// The server and the databases this run made on it.
pub struct Server {
    cluster: Option<ThrowawayCluster>,
    admin: tokio_postgres::Config,
    /// `server_version`.
    pub version: String,
    /// `server_version_num`.
    pub version_num: i32,
    /// The pgbench to run (the cluster's own, else the one on PATH).
    pub pgbench: PathBuf,
    /// Prefix of every database this run creates.
    prefix: String,
    created: std::sync::Mutex<Vec<String>>,
}

impl Server {
    /// Starts a throwaway cluster with [`SETTINGS`] and `extra` (`--pg-setting`), or uses the
    /// server at `url` (whose role must be allowed to create databases; its settings are
    /// reported, not changed).
    pub async fn start(url: Option<&str>, extra: &[(String, String)]) -> Result<Server> {
        Self::start_with(url, SETTINGS, extra).await
    }

    /// [`Server::start`] with `settings` instead of [`SETTINGS`] for a throwaway cluster.
    pub async fn start_with(
        url: Option<&str>,
        settings: &[(&str, &str, &str)],
        extra: &[(String, String)],
    ) -> Result<Server> {
        let (admin, cluster, bin_dir) = match url {
            Some(url) => (
                url.parse::<tokio_postgres::Config>()
                    .context("--database-url is not a valid connection string")?,
                None,
                find_bin_dir().ok(),
            ),
            None => {
                let bin_dir = find_bin_dir().context("PostgreSQL server binaries")?;
                let mut options = ClusterOptions::default();
                for (name, value, _) in settings {
                    let needs_library = name.starts_with("pg_stat_statements")
                        || *name == "shared_preload_libraries";
                    if needs_library && !has_library(&bin_dir, "pg_stat_statements") {
                        continue;
                    }
                    options = options.set(name, value);
                }
                for (name, value) in extra {
                    options = options.set(name, value);
                }
                let dir = bin_dir.clone();
                let cluster = tokio::task::spawn_blocking(move || {
                    ThrowawayCluster::start_with(&dir, &options)
                })
                .await?
                .context("cannot start the benchmark's PostgreSQL")?;
                let admin = cluster.url("postgres").parse()?;
                (admin, Some(cluster), Some(bin_dir))
            }
        };
        let pgbench = bin_dir
            .map(|d| d.join("pgbench"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("pgbench"));
        let mut server = Server {
            cluster,
            admin,
            version: String::new(),
            version_num: 0,
            pgbench,
            prefix: format!("tombstoned_bench_{}_", std::process::id()),
            created: std::sync::Mutex::new(Vec::new()),
        };
        let client = server.admin().await?;
        let row = client
            .query_one(
                "SELECT current_setting('server_version'), \
                 current_setting('server_version_num')::int",
                &[],
            )
            .await?;
        server.version = row.get(0);
        server.version_num = row.get(1);
        if server.version_num < 140000 {
            bail!("the benchmark needs PostgreSQL 14 or later (pg_stat_wal, DROP DATABASE FORCE)");
        }
        // pg_stat_statements lives in the maintenance database; its view shows every database.
        if server.has_pg_stat_statements().await {
            client
                .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .await?;
        }
        Ok(server)
    }

    /// Whether this run started its own cluster.
    pub fn is_throwaway(&self) -> bool {
        self.cluster.is_some()
    }

    /// The full name of a database of this run.
    pub fn db_name(&self, short: &str) -> String {
        format!("{}{short}", self.prefix)
    }

    /// A key=value connection string for database `dbname` (libpq, tokio-postgres, pgbench and
    /// `TOMBSTONED_DATABASE_URL` all accept it).
    pub fn url(&self, dbname: &str) -> String {
        tombstoned_testkit::cluster::conninfo_for_database(&self.admin, dbname)
    }

    /// [`Server::url`] for another role (scenario 8's payments service logs in as its own).
    pub fn url_as(&self, dbname: &str, user: &str, password: &str) -> String {
        let mut config = self.admin.clone();
        config.user(user).password(password);
        tombstoned_testkit::cluster::conninfo_for_database(&config, dbname)
    }

    /// A session on the maintenance database.
    pub async fn admin(&self) -> Result<Client> {
        connect(&self.admin).await
    }

    /// A session on `dbname` with `search_path` = the product's schema.
    pub async fn connect(&self, dbname: &str) -> Result<Client> {
        let mut config: tokio_postgres::Config = self.url(dbname).parse()?;
        config.options("-c search_path=tombstoned");
        config.application_name("tombstoned-bench");
        connect(&config).await
    }

    /// Creates an empty database.
    pub async fn create_db(&self, name: &str) -> Result<()> {
        let admin = self.admin().await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("creating database {name}"))?;
        self.created.lock().expect("lock").push(name.to_owned());
        Ok(())
    }

    /// `CHECKPOINT`, then a byte-for-byte copy of `template` (STRATEGY FILE_COPY: the files are
    /// copied, not re-inserted), then `CHECKPOINT` again so the trial starts with no dirty pages
    /// and a fresh checkpoint cycle (every page's first change writes its full image, for every
    /// approach alike). Returns how long the copy took.
    pub async fn copy_db(&self, template: &str, name: &str) -> Result<Duration> {
        let started = Instant::now();
        let admin = self.admin().await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await?;
        admin.batch_execute("CHECKPOINT").await?;
        let strategy = if self.version_num >= 150000 {
            " STRATEGY FILE_COPY"
        } else {
            ""
        };
        admin
            .batch_execute(&format!(
                "CREATE DATABASE {name} TEMPLATE {template}{strategy}"
            ))
            .await
            .with_context(|| format!("copying {template} to {name}"))?;
        admin.batch_execute("CHECKPOINT").await?;
        self.created.lock().expect("lock").push(name.to_owned());
        Ok(started.elapsed())
    }

    /// Drops a database of this run (ending any session still in it).
    pub async fn drop_db(&self, name: &str) -> Result<()> {
        let admin = self.admin().await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await?;
        self.created.lock().expect("lock").retain(|n| n != name);
        Ok(())
    }

    /// Drops every database this run created (on a server given by URL; a throwaway cluster
    /// goes away whole).
    pub async fn drop_all(&self) {
        let names: Vec<String> = self.created.lock().expect("lock").clone();
        for name in names {
            let _ = self.drop_db(&name).await;
        }
    }

    /// Every setting not at its built-in default, as the server reports it.
    pub async fn non_default_settings(&self) -> Result<Vec<Setting>> {
        let admin = self.admin().await?;
        let rows = admin
            .query(
                "SELECT name, current_setting(name), source FROM pg_settings \
                 WHERE source NOT IN ('default', 'override', 'client', 'session') \
                 ORDER BY name",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Setting {
                name: r.get(0),
                value: r.get(1),
                source: r.get(2),
            })
            .collect())
    }

    /// Whether pg_stat_statements is loaded.
    pub async fn has_pg_stat_statements(&self) -> bool {
        match self.admin().await {
            Ok(c) => c
                .query_one("SELECT current_setting('shared_preload_libraries')", &[])
                .await
                .map(|r| r.get::<_, String>(0).contains("pg_stat_statements"))
                .unwrap_or(false),
            Err(_) => false,
        }
    }

    /// The cluster's data directory, when this run owns the cluster (for `pg_waldump`).
    pub fn data_dir(&self) -> Option<PathBuf> {
        self.cluster.as_ref().map(|c| c.dir().join("data"))
    }

    /// A real PgBouncer in `mode` with `pool_size` server connections per database in front of
    /// this server (scenario 11), stopped when dropped.
    pub async fn pgbouncer(&self, mode: PoolMode, pool_size: u32) -> Result<PgBouncer> {
        PgBouncer::start_for(&self.admin, self.cluster.as_ref(), mode, pool_size)
            .await
            .context("starting PgBouncer (Debian package pgbouncer)")
    }

    /// The server binaries' directory, when this run owns the cluster.
    pub fn bin_dir(&self) -> Option<&Path> {
        self.cluster.as_ref().map(|c| c.bin_dir())
    }
}

fn has_library(bin_dir: &Path, name: &str) -> bool {
    let Some(root) = bin_dir.parent() else {
        return false;
    };
    let file = format!("{name}.so");
    // Debian: /usr/lib/postgresql/15/lib; the embedded-postgres package: native/lib/postgresql.
    [
        root.join("lib").join(&file),
        root.join("lib/postgresql").join(&file),
    ]
    .iter()
    .any(|p| p.is_file())
}

async fn connect(config: &tokio_postgres::Config) -> Result<Client> {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .context("cannot connect to the benchmark's PostgreSQL")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The cluster-wide WAL position, bytes.
pub async fn wal_lsn(client: &Client) -> Result<i64> {
    Ok(client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint",
            &[],
        )
        .await?
        .get(0))
}

/// Checkpoints started so far (timed and requested); PostgreSQL 17 moved the counters to
/// `pg_stat_checkpointer`.
pub async fn checkpoints(client: &Client, version_num: i32) -> Result<i64> {
    let sql = if version_num >= 170000 {
        "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
    } else {
        "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
    };
    Ok(client.query_one(sql, &[]).await?.get(0))
}
