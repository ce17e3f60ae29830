//! A real OTLP/HTTP trace receiver on loopback for the tracing tests: our own axum server on
//! `POST /v1/traces`, decoding each protobuf `ExportTraceServiceRequest` with the
//! `opentelemetry-proto` crate (the daemon's exporter encodes with the same generated types), and
//! keeping every span it accepted, flattened, and the headers of every request. It can also
//! answer 500, answer late, be down (its listener closed), serve HTTPS with the test PKI
//! (`tls_support`), or want a header (401 without it, as a collector that needs credentials).

#![allow(dead_code)] // each tracing test uses a different subset

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message as _;
use tokio::task::JoinHandle;

use crate::tls_support::{TestPki, TlsListener};

/// How the receiver answers an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 200 with an empty `ExportTraceServiceResponse`; the spans are kept.
    Accept,
    /// This status; nothing kept.
    Status(u16),
    /// 200 after this long; the spans are kept.
    Late(Duration),
}

/// One exported span, flattened.
#[derive(Debug, Clone)]
pub struct ExportedSpan {
    /// `service.name` of its resource.
    pub service: String,
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// 16 lowercase hex digits, empty for a root.
    pub parent_span_id: String,
    /// Its name.
    pub name: String,
    /// OTLP's span kind number (2 server, 3 client, 1 internal).
    pub kind: i32,
    /// Every attribute, its value as text.
    pub attributes: Vec<(String, String)>,
    /// Its links' (trace id, span id).
    pub links: Vec<(String, String)>,
    /// OTLP's status code (2: error).
    pub status_code: i32,
}

impl ExportedSpan {
    /// The attribute's value as text.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

struct Shared {
    answer: Mutex<Answer>,
    /// A header every export must carry (name in lowercase, value): answered 401 otherwise.
    required: Mutex<Option<(String, String)>>,
    spans: Mutex<Vec<ExportedSpan>>,
    /// The headers of every export request received, in order.
    requests: Mutex<Vec<HeaderMap>>,
}

/// A running receiver; dropped, or after [`Collector::down`], it is down.
pub struct Collector {
    /// The OTLP/HTTP base URL (`http://127.0.0.1:<port>`, `https://` with TLS) for
    /// `tracing.otlp_endpoint`.
    pub url: String,
    port: u16,
    /// TLS, when it serves HTTPS (kept for [`Collector::up`]).
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
    server: Option<Server>,
}

/// The listening server: its task and what stops it.
struct Server {
    task: JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.task.abort();
        }
    }
}

impl Collector {
    /// A receiver over plain HTTP that accepts every export.
    pub async fn start() -> Collector {
        Collector::start_with(None).await
    }

    /// A receiver over HTTPS presenting `pki`'s server certificate (for 127.0.0.1, signed by
    /// `pki.ca_cert`) that accepts every export. A client that does not trust it is dropped
    /// during the handshake: no request of its reaches the receiver.
    pub async fn start_tls(pki: &TestPki) -> Collector {
        Collector::start_with(Some(pki.acceptor())).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> Collector {
        let shared = Arc::new(Shared {
            answer: Mutex::new(Answer::Accept),
            required: Mutex::new(None),
            spans: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = Some(serve(listener, tls.clone(), shared.clone()));
        let scheme = if tls.is_some() { "https" } else { "http" };
        Collector {
            url: format!("{scheme}://127.0.0.1:{port}"),
            port,
            tls,
            shared,
            server,
        }
    }

    /// Stops listening and closes every connection (an export in flight gets its answer first):
    /// an exporter now finds nothing there.
    pub async fn down(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = server.stop.send(());
            let _ = server.task.await;
        }
    }

    /// Listens again on the same port.
    pub async fn up(&mut self) {
        if self.server.is_none() {
            let address = format!("127.0.0.1:{}", self.port);
            let listener = tokio::net::TcpListener::bind(address).await.unwrap();
            self.server = Some(serve(listener, self.tls.clone(), self.shared.clone()));
        }
    }

    /// How the next exports are answered.
    pub fn answer(&self, answer: Answer) {
        *self.shared.answer.lock().unwrap() = answer;
    }

    /// From now on, an export without the header `name: value` (`name` in lowercase) is
    /// answered 401 and its spans are not kept.
    pub fn require_header(&self, name: &str, value: &str) {
        *self.shared.required.lock().unwrap() = Some((name.to_owned(), value.to_owned()));
    }

    /// Export requests received so far (whatever they were answered).
    pub fn requests(&self) -> u64 {
        self.shared.requests.lock().unwrap().len() as u64
    }

    /// The headers of every export request received so far, in order.
    pub fn request_headers(&self) -> Vec<HeaderMap> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Every span kept so far.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        self.shared.spans.lock().unwrap().clone()
    }

    /// Waits until `done` holds for the spans kept (the exporter sends a batch at least every
    /// second), or fails after `patience` with what was there.
    pub async fn wait_for(
        &self,
        what: &str,
        patience: Duration,
        done: impl Fn(&[ExportedSpan]) -> bool,
    ) -> Vec<ExportedSpan> {
        let deadline = Instant::now() + patience;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: never exported; {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Serves `POST /v1/traces` on `listener`, over TLS when `tls` is given, until told to stop
/// (gracefully: idle keep-alive connections are closed too).
fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
) -> Server {
    let router = axum::Router::new()
        .route("/v1/traces", axum::routing::post(export))
        .with_state(shared);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let stopped = async {
            let _ = stopped.await;
        };
        let _ = match tls {
            None => {
                axum::serve(listener, router)
                    .with_graceful_shutdown(stopped)
                    .await
            }
            Some(acceptor) => {
                axum::serve(TlsListener::new(listener, acceptor), router)
                    .with_graceful_shutdown(stopped)
                    .await
            }
        };
    });
    Server { task, stop }
}

async fn export(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    s.requests.lock().unwrap().push(headers.clone());
    let required = s.required.lock().unwrap().clone();
    if let Some((name, value)) = required {
        if headers.get(&name).and_then(|v| v.to_str().ok()) != Some(value.as_str()) {
            return (StatusCode::UNAUTHORIZED, Vec::new());
        }
    }
    let answer = *s.answer.lock().unwrap();
    match answer {
        Answer::Status(status) => {
            return (StatusCode::from_u16(status).unwrap(), Vec::new());
        }
        Answer::Late(after) => tokio::time::sleep(after).await,
        Answer::Accept => {}
    }
    let Ok(request) = ExportTraceServiceRequest::decode(body.as_ref()) else {
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    let mut kept = s.spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|a| a.key == "service.name")
            .map(text)
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                kept.push(ExportedSpan {
                    service: service.clone(),
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    name: span.name.clone(),
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), text(a)))
                        .collect(),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id)))
                        .collect(),
                    status_code: span.status.as_ref().map_or(0, |s| s.code),
                });
            }
        }
    }
    (StatusCode::OK, Vec::new())
}

/// An attribute's value as text (strings as they are, numbers and booleans spelled).
fn text(attribute: &KeyValue) -> String {
    match attribute.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// A fresh W3C trace id and span id (random, lowercase hex).
pub fn new_ids() -> (String, String) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let span = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
    (id, span)
}
