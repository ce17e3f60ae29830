//! TLS for the tests' own HTTPS servers (the outbox's webhook receiver, the OTLP collector): a
//! throwaway CA and a server certificate for 127.0.0.1 made by the real `openssl`, and a
//! listener that serves axum over rustls with it.

#![allow(dead_code)] // each TLS test uses a different subset

use std::path::PathBuf;
use std::sync::Arc;

/// A test CA and a server certificate for 127.0.0.1 signed by it, made by the real `openssl`.
pub struct TestPki {
    /// The directory holding the files.
    pub dir: tempfile::TempDir,
    /// The CA certificate (PEM): what `outbox.ca_file` or `tracing.ca_file` points at.
    pub ca_cert: PathBuf,
    /// The server certificate (PEM).
    pub server_cert: PathBuf,
    /// The server key (PEM, PKCS#8).
    pub server_key: PathBuf,
}

impl TestPki {
    /// Runs `openssl` to make the CA and the server certificate.
    pub fn create() -> TestPki {
        let dir = tempfile::tempdir().unwrap();
        let p = |name: &str| dir.path().join(name);
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("run openssl (installed on the CI image)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=tombstoned test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        run(&ca);
        let mut csr = vec!["req"];
        csr.extend(ec);
        csr.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        run(&csr);
        std::fs::write(
            p("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]);
        TestPki {
            ca_cert: p("ca.pem"),
            server_cert: p("server.pem"),
            server_key: p("server.key"),
            dir,
        }
    }

    /// A TLS acceptor presenting the server certificate (no client certificates asked for).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        use tokio_rustls::rustls::pki_types::pem::PemObject as _;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_file_iter(&self.server_cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&self.server_key).unwrap();
        let config = tokio_rustls::rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}

/// A TCP listener that completes a TLS handshake before handing the connection to axum;
/// connections whose handshake fails (a client that does not trust us) are dropped.
pub struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    /// The port it listens on.
    pub port: u16,
}

impl TlsListener {
    /// Listens on a free loopback port with `pki`'s server certificate.
    pub async fn bind(pki: &TestPki) -> TlsListener {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        TlsListener::new(tcp, pki.acceptor())
    }

    /// TLS on `tcp`, already bound (a server that comes back on the port it had).
    pub fn new(tcp: tokio::net::TcpListener, acceptor: tokio_rustls::TlsAcceptor) -> TlsListener {
        let port = tcp.local_addr().unwrap().port();
        TlsListener {
            tcp,
            acceptor,
            port,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
