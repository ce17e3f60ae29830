//! Credentials against a real SCRAM-password cluster: `database.password_file` (refused when
//! others can read it), libpq's password file through `$PGPASSFILE` and through `passfile=`,
//! and a scan proving the password never appears in anything tombstoned prints — check-config,
//! migrate, cleanup --dry-run (success and failure), the daemon's log and /readyz.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::OnceLock;

use tombstoned::pg_cluster::{ClusterOptions, ThrowawayCluster};
use tombstoned_testkit::cluster::{ClusterAccess, ClusterOptionsTestExt as _, ClusterTestExt as _};

use crate::conn_support::{run_binary, start_cluster, Run};
use crate::daemon_support::{Daemon, Spec};

/// Distinctive, so a scan for it cannot match anything else.
const PASSWORD: &str = "Pw-7f3e9a1c-scram";

async fn start_scram_cluster() -> ThrowawayCluster {
    start_cluster(
        ClusterOptions::for_tests().set("password_encryption", "scram-sha-256"),
        ClusterAccess::default()
            .superuser_password(PASSWORD)
            .hba(&["host all all 127.0.0.1/32 scram-sha-256"]),
    )
    .await
}

/// The cluster the tests of this module share (never stopped).
fn cluster() -> &'static ThrowawayCluster {
    static CLUSTER: OnceLock<ThrowawayCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(start_scram_cluster())
        })
        .join()
        .unwrap_or_else(|_| panic!("credentials cluster start-up panicked"))
    })
}

/// The URL without a password.
fn url() -> String {
    format!(
        "postgresql://postgres@127.0.0.1:{}/postgres",
        cluster().port()
    )
}

fn write_secret(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn assert_no_password(what: &str, run: &Run) {
    assert!(
        !run.stdout.contains(PASSWORD) && !run.stderr.contains(PASSWORD),
        "{what} printed the password:\n{}\n{}",
        run.stdout,
        run.stderr
    );
}

#[tokio::test]
async fn password_file_is_read_and_a_loose_one_is_refused_with_64() {
    let dir = tempfile::tempdir().unwrap();
    // The path systemd's LoadCredential= gives, in shape.
    let creds = dir.path().join("credentials/tombstoned.service");
    std::fs::create_dir_all(&creds).unwrap();
    let file = creds.join("database-password");
    write_secret(&file, &format!("{PASSWORD}\n"), 0o400);
    let file_env = file.display().to_string();
    let env = [("TOMBSTONED_DATABASE__PASSWORD_FILE", file_env.as_str())];
    let run = run_binary(&["migrate"], &url(), &env).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_no_password("migrate", &run);
    let run = run_binary(&["check-config"], &url(), &env).await;
    assert!(
        run.stdout
            .contains(&format!("password: from database.password_file {file_env}")),
        "{}",
        run.stdout
    );
    assert_no_password("check-config", &run);

    write_secret(&file, PASSWORD, 0o644);
    let run = run_binary(&["migrate"], &url(), &env).await;
    let line = run.error_line(64);
    assert!(
        line.contains("database.password_file") && line.contains("readable by group or others"),
        "{line}"
    );
    assert_no_password("migrate with a loose file", &run);

    // A password in the URL as well is ambiguous.
    write_secret(&file, PASSWORD, 0o600);
    let with_password = url().replace("postgres@", "postgres:other@");
    let run = run_binary(&["check-config"], &with_password, &env).await;
    assert!(run
        .error_line(64)
        .contains("database.url also holds a password"));

    // The wrong password: 69, the source named, the password not.
    write_secret(&file, "not-the-password\n", 0o600);
    let run = run_binary(&["cleanup", "--dry-run"], &url(), &env).await;
    let line = run.error_line(69);
    assert!(line.contains("password authentication failed for user \"postgres\" (28P01; password from database.password_file"), "{line}");
    assert!(!line.contains("not-the-password"), "{line}");
}

#[tokio::test]
async fn pgpass_through_pgpassfile_and_through_passfile() {
    let dir = tempfile::tempdir().unwrap();
    let pgpass = dir.path().join("pgpass");
    let port = cluster().port();
    write_secret(
        &pgpass,
        &format!("# comment\nother:{port}:*:*:wrong\n127.0.0.1:{port}:*:postgres:{PASSWORD}\n"),
        0o600,
    );
    let pgpass_env = pgpass.display().to_string();
    let run = run_binary(
        &["migrate", "--status"],
        &url(),
        &[("PGPASSFILE", &pgpass_env)],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_no_password("migrate via PGPASSFILE", &run);
    let run = run_binary(
        &["migrate", "--status"],
        &format!("{}?passfile={}", url(), pgpass_env),
        &[],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let run = run_binary(&["check-config"], &url(), &[("PGPASSFILE", &pgpass_env)]).await;
    assert!(
        run.stdout.contains(&format!(
            "password: from the libpq password file {pgpass_env}"
        )),
        "{}",
        run.stdout
    );

    // A file others can read is ignored (with a warning), as libpq does: no password then.
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = run_binary(&["migrate"], &url(), &[("PGPASSFILE", &pgpass_env)]).await;
    let line = run.error_line(69);
    assert!(
        line.contains("asks for a password and none is configured"),
        "{line}"
    );
    assert!(
        run.stderr.contains("group or world access"),
        "{}",
        run.stderr
    );
    assert_no_password("migrate with a loose pgpass", &run);
}

#[tokio::test]
async fn the_password_never_appears_in_any_output_or_the_daemons_log_and_readyz() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    write_secret(&file, PASSWORD, 0o600);
    let file_env = file.display().to_string();
    let via_file = [("TOMBSTONED_DATABASE__PASSWORD_FILE", file_env.as_str())];
    let with_password = |form: &str| match form {
        "url" => url().replace("postgres@", &format!("postgres:{PASSWORD}@")),
        _ => format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres password = '{PASSWORD}'",
            cluster().port()
        ),
    };
    let run = run_binary(&["migrate"], &url(), &via_file).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for form in ["url", "keyvalue"] {
        let url = with_password(form);
        for args in [
            &["check-config"][..],
            &["migrate"],
            &["cleanup", "--dry-run"],
        ] {
            let run = run_binary(args, &url, &[]).await;
            assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
            assert_no_password(&format!("{args:?} ({form})"), &run);
        }
        // Failures: a closed port, and a wrong user.
        let closed = url
            .replace(&format!(":{}", cluster().port()), ":1")
            .replace(&format!("port={}", cluster().port()), "port=1");
        let wrong_user = url
            .replace("user=postgres", "user=nobody")
            .replace("postgres:", "nobody:");
        for bad in [closed, wrong_user] {
            for args in [&["migrate"][..], &["cleanup", "--dry-run"]] {
                let run = run_binary(args, &bad, &[]).await;
                run.error_line(69);
                assert_no_password(&format!("{args:?} failing ({form})"), &run);
            }
        }
    }

    // The daemon, password in a key=value URL with spaces around '=', and its /readyz while the
    // database is up and after it went away (a cluster of its own, stopped midway).
    let own = std::sync::Arc::new(start_scram_cluster().await);
    let daemon_url = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres password = '{PASSWORD}'",
        own.port()
    );
    let run = run_binary(&["migrate"], &daemon_url, &[]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let spec = Spec::new(&daemon_url).config("[database]\nconnect_timeout = \"2s\"");
    let daemon = Daemon::start(spec).await;
    let ready = daemon.ops_get("/readyz").await;
    assert!(!ready.text.contains(PASSWORD), "{}", ready.text);
    let stopping = own.clone();
    tokio::task::spawn_blocking(move || stopping.stop_server().unwrap())
        .await
        .unwrap();
    let mut not_ready = daemon.ops_get("/readyz").await;
    for _ in 0..50 {
        if not_ready.status != 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        not_ready = daemon.ops_get("/readyz").await;
    }
    assert_ne!(not_ready.status, 200, "{}", not_ready.text);
    assert!(!not_ready.text.contains(PASSWORD), "{}", not_ready.text);
    let log = daemon.log();
    assert!(log.contains("tombstoned ready"), "{log}");
    assert!(
        !log.contains(PASSWORD),
        "the daemon's log holds the password:\n{log}"
    );
}
