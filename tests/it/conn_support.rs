//! Helpers for the connection tests: certificates made with the real `openssl` CLI (a CA, a
//! server certificate for 127.0.0.1 and localhost, one for another host name, a client
//! certificate, a foreign CA), throwaway clusters started with TLS, `pg_hba.conf` lines and
//! passwords, and the real binary run with a connection string.

#![allow(dead_code)] // each connection test uses a different subset

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tombstoned::config::Config;
use tombstoned::pg_cluster::{ClusterOptions, ThrowawayCluster};
use tombstoned_testkit::cluster::{ClusterAccess, ServerTls};

use crate::harness::binary;

/// Test certificates, in a temporary directory.
pub struct Pki {
    dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run openssl (install it: apt-get install openssl): {e}")
        });
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    /// Makes every certificate the tests use (EC P-256 keys: fast to generate).
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let d = dir.path();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "foreign_ca"] {
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            let (key, crt, subj) = (
                format!("{ca}.key"),
                format!("{ca}.crt"),
                format!("/CN=tombstoned test {ca}"),
            );
            args.extend([
                "-keyout",
                &key,
                "-out",
                &crt,
                "-days",
                "3",
                "-subj",
                &subj,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(d, &args);
        }
        for (name, cn, ext) in [
            (
                "server",
                "localhost",
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            (
                "other",
                "db.example.invalid",
                "subjectAltName=DNS:db.example.invalid\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "certuser", "extendedKeyUsage=clientAuth\n"),
        ] {
            std::fs::write(d.join(format!("{name}.ext")), ext).unwrap();
            let (key, csr, crt, extfile, subj) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
                format!("/CN={cn}"),
            );
            let mut args = vec!["req"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(d, &args);
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "3",
                    "-extfile",
                    &extfile,
                ],
            );
            std::fs::set_permissions(d.join(&key), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        Pki { dir }
    }

    /// A file of the PKI, e.g. `ca.crt`, `client.key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A file's text.
    pub fn pem(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap()
    }

    /// What a cluster serves with: `cert`/`key` (e.g. "server"), client certificates checked
    /// against the test CA.
    pub fn server_tls(&self, name: &str) -> ServerTls {
        ServerTls {
            cert_pem: self.pem(&format!("{name}.crt")),
            key_pem: self.pem(&format!("{name}.key")),
            client_ca_pem: Some(self.pem("ca.crt")),
        }
    }
}

/// Starts a cluster off the async runtime (start-up blocks), then applies `access` to it.
pub async fn start_cluster(options: ClusterOptions, access: ClusterAccess) -> ThrowawayCluster {
    let cluster = tokio::task::spawn_blocking(move || {
        ThrowawayCluster::start(&options).unwrap_or_else(|e| panic!("cluster: {e}"))
    })
    .await
    .unwrap();
    access
        .apply(&cluster)
        .await
        .unwrap_or_else(|e| panic!("cluster access: {e}"));
    cluster
}

/// A configuration for `url`, with extra `TOMBSTONED_*` variables.
pub fn config(url: &str, env: &[(&str, &str)]) -> Config {
    let mut vars = vec![
        ("TOMBSTONED_DATABASE_URL".to_owned(), url.to_owned()),
        (
            "TOMBSTONED_DATABASE__CONNECT_TIMEOUT".to_owned(),
            "5s".to_owned(),
        ),
    ];
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config::load_from(None, vars, &[]).unwrap_or_else(|e| panic!("configuration: {e}"))
}

/// What a run of the real binary printed.
#[derive(Debug)]
pub struct Run {
    /// Exit status code.
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// The one `tombstoned: error:` line, asserting there is exactly one and that the run
    /// ended with `code`.
    pub fn error_line(&self, code: i32) -> &str {
        assert_eq!(
            self.code,
            Some(code),
            "stdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("tombstoned: error:"))
            .collect();
        assert_eq!(lines.len(), 1, "one error line expected: {}", self.stderr);
        lines[0]
    }
}

/// Runs `tombstoned args...` with a clean environment: `TOMBSTONED_DATABASE_URL=url`, a
/// connect timeout of 5 s, HOME in an empty directory (no ~/.pgpass, no ~/.postgresql), and
/// `env`.
pub async fn run_binary(args: &[&str], url: &str, env: &[(&str, &str)]) -> Run {
    let home = tempfile::tempdir().unwrap();
    let mut command = Command::new(binary());
    command
        .args(args)
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("TOMBSTONED_DATABASE_URL", url)
        .env("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "5s")
        // check-config and serve read it (the API is on by default).
        .env(
            "TOMBSTONED_API__TOKENS_FILE",
            crate::ops_support::repo_root().join("config/tokens.toml"),
        );
    for (k, v) in env {
        command.env(k, v);
    }
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || command.output().unwrap()),
    )
    .await
    .expect("the binary finished within 60 s")
    .unwrap();
    drop(home);
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
