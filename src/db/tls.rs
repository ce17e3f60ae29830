//! TLS to PostgreSQL with rustls, giving every `sslmode` its libpq meaning: which certificate
//! checks run (none, the chain, the chain and the host name), which root certificates they
//! trust (a PEM file, the system's, or libpq's default `~/.postgresql/root.crt`), the client
//! certificate, and the TLS connector that records whether TLS was attempted, so "the server
//! does not support SSL" is known without reading an error's text.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::conninfo::{ConnInfo, RootCert, SslMode, TlsVersion};
use super::credentials::home_dir;

/// Why the TLS settings cannot be used. Names the file; never a key or a password.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// A certificate or key file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// sslrootcert, sslcert, sslkey.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no PEM certificate.
    #[error("{what} {path} holds no PEM certificate")]
    NoCertificate {
        /// sslrootcert or sslcert.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no key rustls can read.
    #[error(
        "sslkey {path} holds no unencrypted private key in PEM (PKCS#8, PKCS#1 or SEC1){hint}"
    )]
    NoKey {
        /// The file.
        path: PathBuf,
        /// Advice for an encrypted key.
        hint: &'static str,
    },
    /// The private key file is readable by others.
    #[error(
        "private key file {path} has group or world access; it must be u=rw (0600) or less, \
         or u=rw,g=r (0640) or less if owned by root, as libpq requires"
    )]
    KeyTooOpen {
        /// The file.
        path: PathBuf,
    },
    /// A client certificate without a key.
    #[error("sslcert {cert} is set but its key {key} does not exist (set sslkey)")]
    MissingKey {
        /// The certificate.
        cert: PathBuf,
        /// The key looked for.
        key: PathBuf,
    },
    /// verify-ca / verify-full without any root certificate.
    #[error(
        "sslmode={mode} needs root certificates, but {path} does not exist: set sslrootcert to a \
         PEM file, or to \"system\" for the system's trusted roots"
    )]
    NoRootCertificate {
        /// The mode.
        mode: SslMode,
        /// libpq's default root certificate file that was looked for.
        path: String,
    },
    /// The operating system's roots could not be loaded.
    #[error("cannot load the system's root certificates (sslrootcert=system): {0}")]
    SystemRoots(String),
    /// rustls refused the configuration (a certificate it cannot parse, a key not matching).
    #[error("the TLS settings are not usable: {0}")]
    Rustls(String),
}

/// What a TLS connection checks of the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verification {
    /// Nothing: encryption only (require/prefer/allow without root certificates).
    None,
    /// The chain up to a trusted root, not the host name (verify-ca; require with roots).
    Chain,
    /// The chain and the host name, DNS or IP SAN (verify-full).
    ChainAndHostName,
}

/// The root certificates in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    /// None configured or found.
    None,
    /// A PEM file (given, or libpq's default `~/.postgresql/root.crt`).
    File(PathBuf),
    /// The operating system's.
    System,
}

impl std::fmt::Display for Roots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Roots::None => f.write_str("none"),
            Roots::File(p) => write!(f, "{}", p.display()),
            Roots::System => f.write_str("system roots"),
        }
    }
}

/// The TLS side of a connection string, resolved: what `check-config` prints and what
/// [`TlsSetup::client_config`] builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPlan {
    /// The effective sslmode.
    pub mode: SslMode,
    /// What is checked of the server's certificate.
    pub verification: Verification,
    /// The root certificates.
    pub roots: Roots,
    /// The client certificate and key, if any.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

fn postgresql_dir() -> Option<PathBuf> {
    home_dir().map(|h| h.join(".postgresql"))
}

impl TlsPlan {
    /// Resolves the TLS settings of `conninfo` as libpq does: default files under
    /// `~/.postgresql/` when they exist, `require` checking the chain once roots are there.
    pub fn resolve(conninfo: &ConnInfo) -> Result<Self, TlsSetupError> {
        Self::resolve_in(conninfo, postgresql_dir())
    }

    /// [`TlsPlan::resolve`] with libpq's default files looked for in `dir`.
    fn resolve_in(conninfo: &ConnInfo, dir: Option<PathBuf>) -> Result<Self, TlsSetupError> {
        let mode = conninfo.sslmode();
        let default_root = dir.as_ref().map(|d| d.join("root.crt"));
        let roots = match conninfo.sslrootcert() {
            Some(RootCert::System) => Roots::System,
            Some(RootCert::File(p)) => Roots::File(p.clone()),
            None => match &default_root {
                Some(p) if p.is_file() && mode != SslMode::Disable => Roots::File(p.clone()),
                _ => Roots::None,
            },
        };
        let verification = match (mode, &roots) {
            (SslMode::VerifyFull, _) => Verification::ChainAndHostName,
            (SslMode::VerifyCa, _) => Verification::Chain,
            (SslMode::Disable, _) | (_, Roots::None) => Verification::None,
            // libpq: with a root certificate, require (and prefer, allow) check the chain.
            _ => Verification::Chain,
        };
        if verification != Verification::None && roots == Roots::None {
            return Err(TlsSetupError::NoRootCertificate {
                mode,
                path: default_root.map_or_else(
                    || "~/.postgresql/root.crt".to_owned(),
                    |p| p.display().to_string(),
                ),
            });
        }
        let client_cert = match conninfo.sslcert() {
            Some(cert) => Some(cert.to_owned()),
            None => dir
                .as_ref()
                .map(|d| d.join("postgresql.crt"))
                .filter(|p| p.is_file() && mode != SslMode::Disable),
        };
        let client_cert = match client_cert {
            None => None,
            Some(cert) => {
                let key = match conninfo.sslkey() {
                    Some(k) => k.to_owned(),
                    None => dir
                        .as_ref()
                        .map(|d| d.join("postgresql.key"))
                        .unwrap_or_else(|| PathBuf::from("~/.postgresql/postgresql.key")),
                };
                Some((cert, key))
            }
        };
        Ok(TlsPlan {
            mode,
            verification,
            roots,
            client_cert,
        })
    }

    /// One line for `check-config`.
    pub fn describe(&self) -> String {
        let checks = match (self.mode, self.verification) {
            (SslMode::Disable, _) => "never encrypted",
            (SslMode::Allow, Verification::None) => {
                "plaintext first, TLS if the server refuses it; certificate not checked"
            }
            (SslMode::Prefer, Verification::None) => {
                "TLS if the server offers it, else plaintext; certificate not checked"
            }
            (SslMode::Require, Verification::None) => "TLS always; certificate not checked",
            (SslMode::Allow | SslMode::Prefer, _) => {
                "TLS when used checks the certificate chain (not the host name)"
            }
            (_, Verification::Chain) => "TLS always; certificate chain checked, host name not",
            (_, _) => "TLS always; certificate chain and host name checked",
        };
        let client = match &self.client_cert {
            Some((cert, key)) => format!("{} (key {})", cert.display(), key.display()),
            None => "none".to_owned(),
        };
        format!(
            "sslmode {} ({checks}); root certificates: {}; client certificate: {client}",
            self.mode, self.roots
        )
    }
}

fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

/// The system's roots, loaded once per process (reading the bundle costs milliseconds).
fn system_roots() -> Result<Arc<RootCertStore>, TlsSetupError> {
    static ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut store = RootCertStore::empty();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map_or_else(|| "no certificate found".to_owned(), ToString::to_string);
                return Err(why);
            }
            Ok(Arc::new(store))
        })
        .clone()
        .map_err(TlsSetupError::SystemRoots)
}

fn read_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let bytes = std::fs::read(path).map_err(|source| TlsSetupError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsSetupError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|source| TlsSetupError::Read {
        what: "sslkey",
        path: path.to_owned(),
        source,
    })?;
    // libpq's rule: 0600 or less, or 0640 or less when owned by root.
    let mode = meta.mode() & 0o777;
    let loose = if meta.uid() == 0 {
        mode & 0o037 != 0
    } else {
        mode & 0o077 != 0
    };
    if loose {
        return Err(TlsSetupError::KeyTooOpen {
            path: path.to_owned(),
        });
    }
    let bytes = std::fs::read(path).map_err(|source| TlsSetupError::Read {
        what: "sslkey",
        path: path.to_owned(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| {
        let encrypted = String::from_utf8_lossy(&bytes).contains("ENCRYPTED");
        TlsSetupError::NoKey {
            path: path.to_owned(),
            hint: if encrypted {
                "; it is encrypted, which tombstoned does not support (sslpassword): decrypt it \
                 with `openssl pkey -in KEY -out KEY.plain` and protect it with file permissions"
            } else {
                ""
            },
        }
    })
}

impl TlsPlan {
    /// The rustls configuration for this plan (reads the certificate files now, so a rotated
    /// file is used by the next connection). `None` for `sslmode=disable`.
    pub fn client_config(
        &self,
        conninfo: &ConnInfo,
    ) -> Result<Option<Arc<ClientConfig>>, TlsSetupError> {
        if self.mode == SslMode::Disable {
            return Ok(None);
        }
        let provider = provider();
        let roots = match &self.roots {
            Roots::None => None,
            Roots::System => Some(system_roots()?),
            Roots::File(path) => {
                let mut store = RootCertStore::empty();
                for cert in read_certs("sslrootcert", path)? {
                    store
                        .add(cert)
                        .map_err(|e| TlsSetupError::Rustls(format!("{}: {e}", path.display())))?;
                }
                Some(Arc::new(store))
            }
        };
        let webpki = |roots: Arc<RootCertStore>| {
            WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| TlsSetupError::Rustls(e.to_string()))
        };
        let verifier: Arc<dyn ServerCertVerifier> = match (self.verification, roots) {
            (Verification::ChainAndHostName, Some(roots)) => webpki(roots)?,
            (Verification::Chain, Some(roots)) => Arc::new(ChainOnly(webpki(roots)?)),
            _ => Arc::new(EncryptionOnly(provider.clone())),
        };
        let (min, max) = conninfo.tls_versions();
        let mut versions = Vec::new();
        if min <= TlsVersion::V1_2 && max.is_none_or(|m| m >= TlsVersion::V1_2) {
            versions.push(&rustls::version::TLS12);
        }
        if max.is_none_or(|m| m >= TlsVersion::V1_3) {
            versions.push(&rustls::version::TLS13);
        }
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&versions)
            .map_err(|e| TlsSetupError::Rustls(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match &self.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                if !key.exists() {
                    return Err(TlsSetupError::MissingKey {
                        cert: cert.clone(),
                        key: key.clone(),
                    });
                }
                let chain = read_certs("sslcert", cert)?;
                builder
                    .with_client_auth_cert(chain, read_key(key)?)
                    .map_err(|e| TlsSetupError::Rustls(format!("sslcert/sslkey: {e}")))?
            }
        };
        config.enable_sni = conninfo.sslsni();
        Ok(Some(Arc::new(config)))
    }
}

/// `require` without roots: the session is encrypted, the peer is not authenticated (libpq's
/// meaning). Handshake signatures are still verified, so the key exchange is sound.
#[derive(Debug)]
struct EncryptionOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptionOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the full webpki check, except that a certificate for another name passes
/// (webpki checks the chain before the name, so a name error means the chain was good).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// How far a connection attempt got; read when it times out or fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Resolving the host name.
    Resolve = 0,
    /// Opening the TCP connection or Unix socket.
    Connect = 1,
    /// Asking the server whether it speaks TLS (SSLRequest).
    SslRequest = 2,
    /// The TLS handshake.
    TlsHandshake = 3,
    /// Startup and authentication.
    Startup = 4,
    /// Checking target_session_attrs and running the session setup.
    SessionCheck = 5,
}

impl Phase {
    /// Words for an error message.
    pub fn describe(self) -> &'static str {
        match self {
            Phase::Resolve => "resolving the host name",
            Phase::Connect => "opening the connection",
            Phase::SslRequest => "waiting for the server's answer to the SSL request",
            Phase::TlsHandshake => "the TLS handshake",
            Phase::Startup => "startup and authentication",
            Phase::SessionCheck => "checking the session (target_session_attrs)",
        }
    }
}

/// Progress of one attempt, shared with the TLS connector.
#[derive(Debug, Default)]
pub struct Progress {
    phase: AtomicU8,
    /// 0: TLS not attempted; 1: handshake started; 2: handshake completed.
    tls: AtomicU8,
}

impl Progress {
    /// Records the phase now entered.
    pub fn enter(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// The phase reached.
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Resolve,
            1 => Phase::Connect,
            2 => Phase::SslRequest,
            3 => Phase::TlsHandshake,
            4 => Phase::Startup,
            _ => Phase::SessionCheck,
        }
    }

    /// Whether a TLS handshake was started (the server accepted the SSL request).
    pub fn tls_attempted(&self) -> bool {
        self.tls.load(Ordering::Acquire) >= 1
    }

    /// Whether the session runs over TLS.
    pub fn tls_established(&self) -> bool {
        self.tls.load(Ordering::Acquire) >= 2
    }
}

type RustlsConnect = <MakeRustlsConnect as MakeTlsConnect<tokio::net::TcpStream>>::TlsConnect;

/// tokio-postgres-rustls's connector, recording in [`Progress`] when the handshake starts and
/// finishes.
pub struct TrackedTls {
    inner: Option<RustlsConnect>,
    progress: Arc<Progress>,
}

impl TrackedTls {
    /// A connector for `server_name` (the host certificates are checked against), or one that
    /// never connects when `config` is `None`.
    pub fn new(
        config: Option<Arc<ClientConfig>>,
        server_name: &str,
        progress: Arc<Progress>,
    ) -> Self {
        let inner = config.map(|config| {
            let mut make = MakeRustlsConnect::new((*config).clone());
            match <MakeRustlsConnect as MakeTlsConnect<tokio::net::TcpStream>>::make_tls_connect(
                &mut make,
                server_name,
            ) {
                Ok(connect) => connect,
                Err(never) => match never {},
            }
        });
        Self { inner, progress }
    }
}

impl<S> TlsConnect<S> for TrackedTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <RustlsConnect as TlsConnect<S>>::Stream;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Stream, std::io::Error>> + Send>,
    >;

    fn connect(self, stream: S) -> Self::Future {
        let progress = self.progress;
        progress.enter(Phase::TlsHandshake);
        progress.tls.store(1, Ordering::Release);
        match self.inner {
            None => Box::pin(async {
                Err(std::io::Error::other(
                    "TLS is not configured for this attempt",
                ))
            }),
            Some(inner) => {
                let handshake = inner.connect(stream);
                Box::pin(async move {
                    let stream = handshake.await?;
                    progress.tls.store(2, Ordering::Release);
                    progress.enter(Phase::Startup);
                    Ok(stream)
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(s: &str, dir: Option<&Path>) -> Result<TlsPlan, TlsSetupError> {
        TlsPlan::resolve_in(&ConnInfo::parse(s).unwrap(), dir.map(Path::to_path_buf))
    }

    #[test]
    fn each_sslmode_checks_what_libpq_checks() {
        let empty = tempfile::tempdir().unwrap();
        let none = Some(empty.path());
        let v = |s: &str| plan(s, none).unwrap().verification;
        assert_eq!(v(""), Verification::None, "prefer");
        assert_eq!(v("sslmode=require"), Verification::None);
        assert_eq!(
            v("sslmode=require sslrootcert=/ca.pem"),
            Verification::Chain
        );
        assert_eq!(
            v("sslmode=verify-ca sslrootcert=/ca.pem"),
            Verification::Chain
        );
        assert_eq!(
            v("sslmode=verify-full sslrootcert=/ca.pem"),
            Verification::ChainAndHostName
        );
        let system = plan("sslrootcert=system", none).unwrap();
        assert_eq!(
            (system.mode, system.verification, system.roots),
            (
                SslMode::VerifyFull,
                Verification::ChainAndHostName,
                Roots::System
            )
        );
        let e = plan("sslmode=verify-ca", none).unwrap_err().to_string();
        assert!(e.contains("root.crt") && e.contains("system"), "{e}");
    }

    #[test]
    fn libpq_default_files_under_dot_postgresql_are_used_when_present() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("root.crt"), "x").unwrap();
        std::fs::write(dir.path().join("postgresql.crt"), "x").unwrap();
        let p = plan("sslmode=require", Some(dir.path())).unwrap();
        assert_eq!(
            p.verification,
            Verification::Chain,
            "require + root.crt = verify-ca"
        );
        assert_eq!(p.roots, Roots::File(dir.path().join("root.crt")));
        assert_eq!(
            p.client_cert,
            Some((
                dir.path().join("postgresql.crt"),
                dir.path().join("postgresql.key")
            ))
        );
        let p = plan("sslmode=disable", Some(dir.path())).unwrap();
        assert_eq!((p.roots, p.client_cert), (Roots::None, None));
    }

    #[test]
    fn unreadable_files_are_named() {
        let p = plan("sslmode=verify-ca sslrootcert=/nonexistent/ca.pem", None).unwrap();
        let e = p
            .client_config(&ConnInfo::parse("sslrootcert=/nonexistent/ca.pem").unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslrootcert /nonexistent/ca.pem"), "{e}");
    }
}
