//! Per-request bookkeeping around every route: `tombstoned_http_requests_total{route,method,status}`
//! and `tombstoned_http_request_duration_seconds{route}` labelled with the route *template* (never
//! a raw path, key or id), `tombstoned_http_requests_in_flight`, the pool gauges, `Cache-Control: no-store`, one log line per
//! request at debug level (no keys, tokens or bodies), and, with tracing on, the request's server
//! span (continuing the caller's W3C `traceparent`; OpenTelemetry's HTTP server conventions, the
//! path never with a key in it).

use std::borrow::Cow;
use std::future::Future;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;

use super::handlers::{Labelled, OutcomeLabel};
use super::state::ApiState;
use super::{RouteSpec, ROUTES, UNMATCHED_ROUTE};
use crate::telemetry::{Attribute, Span};

/// The documented route a request matched (by its path template), if any.
fn route_spec(matched: Option<&MatchedPath>) -> Option<&'static RouteSpec> {
    matched.and_then(|m| ROUTES.iter().find(|r| r.path == m.as_str()))
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::HEAD => "HEAD",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Whether `status` is documented for this route and method (405 and the fallback's 404 are
/// documented globally).
pub(crate) fn is_documented(route: &str, method: &str, status: u16) -> bool {
    if status == 405 {
        return true;
    }
    if route == UNMATCHED_ROUTE {
        return status == 404;
    }
    let method = if method == "HEAD" { "GET" } else { method };
    ROUTES
        .iter()
        .any(|r| r.path == route && r.method == method && r.statuses.contains(&status))
}

/// Counts a request in `tombstoned_http_requests_in_flight` until it is dropped: when the
/// response is ready, or when the client goes away and the request's future is dropped.
struct InFlight(prometheus::IntGauge);

impl InFlight {
    fn enter(gauge: &prometheus::IntGauge) -> Self {
        gauge.inc();
        InFlight(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The request's server span, when tracing is on (nothing is read otherwise): named `METHOD
/// route` after the route's template, a child of the caller's `traceparent` when it sent a valid
/// one. `url.path` is the path only where it holds no key: the key route's and an unknown path's
/// (which could be anything) are left out. A route without parameters names its span and path
/// with its spec's static strings, so its spans allocate neither.
fn server_span(request: &Request, spec: Option<&'static RouteSpec>, method: &'static str) -> Span {
    if !crate::telemetry::enabled() {
        return Span::none();
    }
    let header = |name: &str| {
        let mut values = request.headers().get_all(name).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => value.to_str().ok(),
            _ => None, // absent, or repeated: no usable context
        }
    };
    let name: Cow<'static, str> = match spec {
        Some(spec) if spec.method == method => Cow::Borrowed(spec.span_name),
        Some(spec) => Cow::Owned(format!("{method} {}", spec.path)),
        None => Cow::Borrowed(method),
    };
    let version = match request.version() {
        axum::http::Version::HTTP_2 => "2",
        axum::http::Version::HTTP_10 => "1.0",
        _ => "1.1",
    };
    Span::server(name, header("traceparent"), header("tracestate"), || {
        // With the route's two already: growing the Vec would reallocate it.
        let mut attributes = Vec::with_capacity(5);
        attributes.extend([
            Attribute::new("http.request.method", method),
            Attribute::new("url.scheme", "http"),
            Attribute::new("network.protocol.version", version),
        ]);
        if let Some(spec) = spec {
            attributes.push(Attribute::new("http.route", spec.path));
            if !spec.path.contains('{') {
                attributes.push(Attribute::new("url.path", spec.path));
            } else if !spec.path.contains("{key}") {
                attributes.push(Attribute::new("url.path", request.uri().path().to_owned()));
            }
        }
        attributes
    })
}

/// The middleware of the router's routes: [`tracked`], with the route the router matched and the
/// outcome label the handler left in the response's extensions.
pub(crate) async fn track(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let spec = route_spec(request.extensions().get::<MatchedPath>());
    tracked(&state, spec, request, |request| async move {
        let response = next.run(request).await;
        let outcome = response
            .extensions()
            .get::<OutcomeLabel>()
            .map_or("", |o| o.0);
        Labelled { response, outcome }
    })
    .await
}

/// The bookkeeping of one request of `spec`'s route (`None`: no route matched) around `handle`,
/// whether the router or the API's own dispatch ([`super::dispatch`]) found the route.
pub(crate) async fn tracked<F, H>(
    state: &ApiState,
    spec: Option<&'static RouteSpec>,
    request: Request,
    handle: H,
) -> Response
where
    H: FnOnce(Request) -> F,
    F: Future<Output = Labelled>,
{
    let _in_flight = InFlight::enter(&state.metrics().http_requests_in_flight);
    let started = Instant::now();
    let route = spec.map_or(UNMATCHED_ROUTE, |r| r.path);
    let method = method_label(request.method());
    let span = server_span(&request, spec, method);
    let Labelled {
        mut response,
        outcome,
    } = span.in_scope(handle(request)).await;
    let status = response.status().as_u16();
    let elapsed = started.elapsed();

    let metrics = state.metrics();
    metrics
        .http_requests
        .with_label_values(&[route, method, response.status().as_str()])
        .inc();
    metrics
        .http_request_duration
        .with_label_values(&[route])
        .observe(elapsed.as_secs_f64());
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));

    tracing::debug!(
        route,
        method,
        status,
        outcome,
        duration_ms = elapsed.as_secs_f64() * 1000.0,
        "request"
    );
    span.set(|| {
        vec![
            Attribute::new("http.response.status_code", i64::from(status)),
            Attribute::new("tombstoned.outcome", outcome),
        ]
    });
    if status >= 500 {
        span.fail(status.to_string());
    }
    span.end();
    // The OpenAPI document promises a closed set of statuses per route; tests (debug builds) fail
    // loudly when a handler answers outside it.
    debug_assert!(
        is_documented(route, method, status),
        "undocumented status {status} for {method} {route}"
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_routes_span_name_is_its_method_and_template() {
        for route in ROUTES {
            assert_eq!(route.span_name, format!("{} {}", route.method, route.path));
        }
    }
}
