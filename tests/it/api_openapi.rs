//! docs/openapi.json against the server: the same routes, the same statuses per route, the same
//! problem types, and every documented route answered by the real router.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use tombstoned::http::problem::ProblemType;
use tombstoned::http::ROUTES;

use crate::api_support::{TestApi, ALICE};

fn document() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// (METHOD, path) → statuses, from the document.
fn documented_routes(doc: &Value) -> BTreeMap<(String, String), BTreeSet<u16>> {
    let mut routes = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if method == "parameters" {
                continue;
            }
            let statuses = operation["responses"]
                .as_object()
                .unwrap()
                .keys()
                .map(|s| s.parse::<u16>().unwrap())
                .collect();
            routes.insert((method.to_uppercase(), path.clone()), statuses);
        }
    }
    routes
}

#[test]
fn the_document_lists_exactly_the_routes_and_statuses_of_the_code() {
    let doc = document();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let in_code: BTreeMap<(String, String), BTreeSet<u16>> = ROUTES
        .iter()
        .map(|r| {
            (
                (r.method.to_owned(), r.path.to_owned()),
                r.statuses.iter().copied().collect(),
            )
        })
        .collect();
    assert_eq!(documented_routes(&doc), in_code);
}

#[test]
fn the_document_lists_exactly_the_problem_types_of_the_code() {
    let doc = document();
    let documented: Vec<&str> = doc["components"]["schemas"]["Problem"]["properties"]["type"]
        ["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let in_code: Vec<String> = ProblemType::ALL.iter().map(|p| p.uri()).collect();
    assert_eq!(documented, in_code);
    // Every problem type a route can answer with is named in that route's responses, under its
    // status (405 and route-not-found are global: no documented route answers with them).
    let text = doc.to_string();
    for p in ProblemType::ALL {
        if matches!(
            p,
            ProblemType::MethodNotAllowed | ProblemType::RouteNotFound
        ) {
            continue;
        }
        assert!(
            text.contains(&format!("`{}`", p.name())),
            "{} is described nowhere",
            p.name()
        );
    }
    // And the media types: JSON for success, problem+json for errors.
    for item in doc["paths"].as_object().unwrap().values() {
        for operation in item.as_object().unwrap().values() {
            for (status, response) in operation["responses"].as_object().unwrap() {
                let response = match response.get("$ref") {
                    Some(r) => {
                        let name = r.as_str().unwrap().rsplit('/').next().unwrap();
                        &doc["components"]["responses"][name]
                    }
                    None => response,
                };
                let media = response["content"].as_object().unwrap();
                let expected = if status.starts_with('2') {
                    "application/json"
                } else {
                    "application/problem+json"
                };
                assert!(media.contains_key(expected), "{status}: {media:?}");
            }
        }
    }
}

#[test]
fn the_api_doc_names_every_problem_type() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md")).unwrap();
    for p in ProblemType::ALL {
        assert!(
            text.contains(&format!("`{}`", p.name())),
            "docs/api.md does not describe {}",
            p.name()
        );
    }
}

#[tokio::test]
async fn every_documented_route_is_served_by_the_router() {
    let api = TestApi::start().await;
    for ((method, path), _) in documented_routes(&document()) {
        let concrete = path
            .replace("{order_id}", "0193a4c2-0000-7000-8000-000000000000")
            .replace("{key}", "some-key");
        let url = format!("{}{concrete}", api.base);
        let request = match method.as_str() {
            "GET" => api.http.get(&url),
            "POST" => api
                .http
                .post(&url)
                .header("idempotency-key", "openapi-probe")
                .header("content-type", "application/json")
                .body("{}"),
            other => panic!("add {other} here"),
        };
        let reply = TestApi::reply(request.bearer_auth(ALICE).send().await.unwrap()).await;
        assert_ne!(reply.status, 405, "{method} {path}");
        assert_ne!(reply.problem(), "route-not-found", "{method} {path}");
    }
    // And the fallbacks are what the document does not list.
    let unknown = api.get(Some(ALICE), "/v1/nothing").await;
    unknown.expect(404);
    assert_eq!(unknown.problem(), "route-not-found");
}
