//! The API's front door: `POST /v1/orders`, the request nearly all of the API's traffic is, goes
//! straight to its handler inside the same bookkeeping as every route ([`middleware::tracked`]);
//! every other request goes through the router.
//!
//! Why not the router for it too: axum boxes the handler's future, the middleware's and the
//! route's, clones the boxed services, and fills the request's extensions (matched path, URL
//! parameters) and the response's (the outcome label): about twenty allocations per request, a
//! quarter of all a replay made, for a route whose path has no parameter. The router keeps the route all the same: it answers 405 to other methods on the
//! path, and what is served through it answers exactly as here.

use axum::extract::Request;
use axum::http::{header, Method};
use axum::response::Response;
use axum::Router;
use hyper::body::Body as HttpBody;

use super::state::ApiState;
use super::{handlers, middleware, router, RouteSpec, ROUTES};
use crate::connections::App;

/// The route served without the router.
const CREATE_ORDER: &RouteSpec = &ROUTES[0];

/// The API as its listener serves it.
#[derive(Clone)]
pub(crate) struct Api {
    state: ApiState,
    router: Router,
}

impl Api {
    pub(crate) fn new(state: ApiState) -> Self {
        Api {
            router: router(state.clone()),
            state,
        }
    }
}

impl App for Api {
    async fn respond(self, request: Request) -> Response {
        // The path as the router matches it: exact, undecoded, without the query.
        if request.method() == Method::POST && request.uri().path() == CREATE_ORDER.path {
            let state = &self.state;
            let mut response = middleware::tracked(state, Some(CREATE_ORDER), request, |request| {
                handlers::create_order(state, request)
            })
            .await;
            // What the router does for every route: the listener wraps the body afterwards,
            // which hides its size from hyper, and the answer would go out chunked.
            if let Some(len) = HttpBody::size_hint(response.body()).exact() {
                response
                    .headers_mut()
                    .insert(header::CONTENT_LENGTH, len.into());
            }
            response
        } else {
            self.router.respond(request).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_served_directly_is_create_order() {
        assert_eq!(
            (CREATE_ORDER.method, CREATE_ORDER.path),
            ("POST", "/v1/orders")
        );
    }
}
