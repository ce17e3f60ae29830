//! TLS against real servers: a cluster with `ssl = on` and `hostssl`-only `pg_hba.conf` (one
//! line `cert`, the rest SCRAM), a second one serving a certificate for another host name, and
//! the harness's plaintext cluster. Every failure also goes through the real binary: exit 69
//! and one line saying what failed.

use std::sync::OnceLock;

use tombstoned::db;
use tombstoned::pg_cluster::{ClusterOptions, ThrowawayCluster};
use tombstoned_testkit::cluster::{ClusterAccess, ClusterOptionsTestExt as _};

use crate::conn_support::{config, run_binary, start_cluster, Pki};
use crate::harness::TestDb;

const SUPERUSER_PASSWORD: &str = "Tls-Sup3r-Pw";

struct TlsEnv {
    pki: Pki,
    /// Certificate for 127.0.0.1 and localhost; hostssl only (certuser: cert; others: SCRAM).
    main: ThrowawayCluster,
    /// Certificate for db.example.invalid, signed by the same CA; hostssl, SCRAM.
    other_name: ThrowawayCluster,
}

fn env() -> &'static TlsEnv {
    static ENV: OnceLock<TlsEnv> = OnceLock::new();
    ENV.get_or_init(|| {
        std::thread::spawn(|| {
            let pki = Pki::generate();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let options =
                    ClusterOptions::for_tests().set("password_encryption", "scram-sha-256");
                let hostssl = ClusterAccess::default().superuser_password(SUPERUSER_PASSWORD);
                let main = start_cluster(
                    options.clone(),
                    hostssl.clone().tls(pki.server_tls("server")).hba(&[
                        "hostssl all certuser 127.0.0.1/32 cert",
                        "hostssl all all 127.0.0.1/32 scram-sha-256",
                    ]),
                )
                .await;
                let other_name = start_cluster(
                    options,
                    hostssl
                        .tls(pki.server_tls("other"))
                        .hba(&["hostssl all all 127.0.0.1/32 scram-sha-256"]),
                )
                .await;
                let env = TlsEnv {
                    pki,
                    main,
                    other_name,
                };
                // The certificate user, created over TLS with the superuser's password.
                let admin = db::connect(
                    &config(&env.url(&env.main, "sslmode=require"), &[]).database,
                    "test",
                )
                .await
                .unwrap_or_else(|e| panic!("admin session: {e}"));
                admin
                    .client
                    .batch_execute("CREATE ROLE certuser LOGIN SUPERUSER")
                    .await
                    .unwrap();
                env
            })
        })
        .join()
        .unwrap_or_else(|_| panic!("TLS test environment set-up panicked"))
    })
}

impl TlsEnv {
    /// A key=value string for the superuser on `cluster`, plus `extra`.
    fn url(&self, cluster: &ThrowawayCluster, extra: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres password={SUPERUSER_PASSWORD} dbname=postgres {extra}",
            cluster.port()
        )
    }

    fn file(&self, name: &str) -> String {
        self.pki.path(name).display().to_string()
    }
}

async fn server_uses_tls(url: &str) -> (bool, String) {
    let connected = db::connector(&config(url, &[]).database, "test")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let row = connected
        .client
        .query_one(
            "SELECT ssl, current_user::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    let (ssl, user): (bool, String) = (row.get(0), row.get(1));
    assert_eq!(
        ssl, connected.server.tls,
        "the connector knows whether it encrypted"
    );
    (ssl, user)
}

#[tokio::test]
async fn verify_full_connects_by_ip_and_by_dns_name() {
    let env = env();
    let ca = env.file("ca.crt");
    let (ssl, _) =
        server_uses_tls(&env.url(&env.main, &format!("sslmode=verify-full sslrootcert={ca}")))
            .await;
    assert!(ssl);
    let by_name = env
        .url(&env.main, &format!("sslmode=verify-full sslrootcert={ca}"))
        .replace("host=127.0.0.1", "host=localhost");
    assert!(server_uses_tls(&by_name).await.0);
    let run = run_binary(
        &["migrate"],
        &env.url(&env.main, &format!("sslmode=verify-full sslrootcert={ca}")),
        &[],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[tokio::test]
async fn a_certificate_for_another_host_fails_verify_full_and_passes_verify_ca() {
    let env = env();
    let ca = env.file("ca.crt");
    let run = run_binary(
        &["migrate"],
        &env.url(
            &env.other_name,
            &format!("sslmode=verify-full sslrootcert={ca}"),
        ),
        &[],
    )
    .await;
    let line = run.error_line(69);
    assert!(
        line.contains(
            "server certificate is for db.example.invalid, not for host name \"127.0.0.1\""
        ),
        "{line}"
    );
    let (ssl, _) = server_uses_tls(&env.url(
        &env.other_name,
        &format!("sslmode=verify-ca sslrootcert={ca}"),
    ))
    .await;
    assert!(ssl);
}

#[tokio::test]
async fn a_foreign_ca_fails_verify_ca_naming_the_file() {
    let env = env();
    let foreign = env.file("foreign_ca.crt");
    let run = run_binary(
        &["cleanup", "--dry-run"],
        &env.url(
            &env.main,
            &format!("sslmode=verify-ca sslrootcert={foreign}"),
        ),
        &[],
    )
    .await;
    let line = run.error_line(69);
    assert!(
        line.contains("server certificate verify failed: unknown certificate authority"),
        "{line}"
    );
    assert!(line.contains(&foreign), "{line}");
    // require with a root certificate checks the chain too, as libpq does.
    let run = run_binary(
        &["migrate", "--status"],
        &env.url(&env.main, &format!("sslmode=require sslrootcert={foreign}")),
        &[],
    )
    .await;
    assert!(run.error_line(69).contains("unknown certificate authority"));
}

#[tokio::test]
async fn sslmode_disable_is_refused_by_the_servers_pg_hba() {
    let env = env();
    let run = run_binary(&["migrate"], &env.url(&env.main, "sslmode=disable"), &[]).await;
    let line = run.error_line(69);
    assert!(
        line.contains("refused a connection without TLS (28000"),
        "{line}"
    );
    assert!(line.contains("sslmode=require or stronger"), "{line}");
    assert!(!line.contains(SUPERUSER_PASSWORD), "{line}");
    // allow: plaintext refused, so TLS.
    assert!(
        server_uses_tls(&env.url(&env.main, "sslmode=allow"))
            .await
            .0
    );
}

#[tokio::test]
async fn prefer_encrypts_with_a_certificate_it_does_not_check() {
    // No root certificate configured: the server's certificate is as unknown as a self-signed
    // one, and prefer (the default) and require still encrypt.
    let env = env();
    assert!(server_uses_tls(&env.url(&env.main, "")).await.0);
    assert!(
        server_uses_tls(&env.url(&env.other_name, "sslmode=require"))
            .await
            .0
    );
}

#[tokio::test]
async fn client_certificate_login() {
    let env = env();
    let url = format!(
        "host=localhost port={} user=certuser dbname=postgres sslmode=verify-full sslrootcert={} \
         sslcert={} sslkey={}",
        env.main.port(),
        env.file("ca.crt"),
        env.file("client.crt"),
        env.file("client.key"),
    );
    let (ssl, user) = server_uses_tls(&url).await;
    assert!(ssl);
    assert_eq!(user, "certuser");
    let run = run_binary(&["migrate", "--status"], &url, &[]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Without the certificate the server refuses the login.
    let without = format!(
        "host=localhost port={} user=certuser dbname=postgres sslmode=verify-full sslrootcert={}",
        env.main.port(),
        env.file("ca.crt"),
    );
    let run = run_binary(&["migrate"], &without, &[]).await;
    let line = run.error_line(69);
    assert!(line.contains("refused the login (28000"), "{line}");
}

#[tokio::test]
async fn channel_binding_require_works_over_tls_with_scram_and_fails_without_tls() {
    let env = env();
    assert!(
        server_uses_tls(&env.url(&env.main, "sslmode=require channel_binding=require"))
            .await
            .0
    );
    // Certificate authentication has no SCRAM exchange to bind.
    let cert_login = format!(
        "host=127.0.0.1 port={} user=certuser dbname=postgres sslmode=require sslcert={} \
         sslkey={} channel_binding=require",
        env.main.port(),
        env.file("client.crt"),
        env.file("client.key"),
    );
    let run = run_binary(&["migrate"], &cert_login, &[]).await;
    assert!(run
        .error_line(69)
        .contains("did not authenticate with channel binding"));
    // The plaintext cluster: prefer falls back to plaintext, and channel binding cannot hold.
    let db = TestDb::new().await;
    let run = run_binary(
        &["migrate"],
        &format!("{} channel_binding=require", db.url),
        &[],
    )
    .await;
    let line = run.error_line(69);
    assert!(
        line.contains("channel_binding=require, but the connection is not encrypted"),
        "{line}"
    );
    let run = run_binary(
        &["migrate"],
        &format!("{} sslmode=disable channel_binding=require", db.url),
        &[],
    )
    .await;
    assert!(run
        .error_line(69)
        .contains("not encrypted (sslmode=disable)"));
}

#[tokio::test]
async fn against_a_server_without_ssl_prefer_falls_back_and_require_says_so() {
    let db = TestDb::new().await;
    let (ssl, _) = server_uses_tls(&db.url).await;
    assert!(!ssl, "prefer (the default) fell back to plaintext");
    let run = run_binary(
        &["cleanup", "--dry-run"],
        &format!("{} sslmode=require", db.url),
        &[],
    )
    .await;
    let line = run.error_line(69);
    assert!(
        line.contains("the server does not support SSL, but sslmode=require requires it"),
        "{line}"
    );
    let run = run_binary(
        &["migrate"],
        &format!(
            "{} sslmode=verify-full sslrootcert={}",
            db.url,
            env().file("ca.crt")
        ),
        &[],
    )
    .await;
    assert!(run.error_line(69).contains("does not support SSL"));
}

#[tokio::test]
async fn check_config_prints_the_tls_mode_files_and_hosts_never_the_password() {
    let env = env();
    let url = env.url(
        &env.main,
        &format!(
            "sslmode=verify-full sslrootcert={} sslcert={} sslkey={} target_session_attrs=read-write",
            env.file("ca.crt"),
            env.file("client.crt"),
            env.file("client.key")
        ),
    );
    let run = run_binary(&["check-config"], &url, &[]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let out = &run.stdout;
    assert!(
        out.contains("sslmode verify-full (TLS always; certificate chain and host name checked)"),
        "{out}"
    );
    assert!(
        out.contains(&format!("root certificates: {}", env.file("ca.crt"))),
        "{out}"
    );
    assert!(
        out.contains(&format!("client certificate: {}", env.file("client.crt"))),
        "{out}"
    );
    assert!(
        out.contains(&format!("hosts (in order): 127.0.0.1:{}", env.main.port())),
        "{out}"
    );
    assert!(out.contains("target_session_attrs read-write"), "{out}");
    assert!(
        out.contains("password: from the connection string"),
        "{out}"
    );
    assert!(!out.contains(SUPERUSER_PASSWORD) && !run.stderr.contains(SUPERUSER_PASSWORD));
    let run = run_binary(
        &["check-config"],
        &format!("{url} sslrootcert=/nonexistent/ca.pem"),
        &[],
    )
    .await;
    assert!(run.error_line(64).contains("/nonexistent/ca.pem"));
}
