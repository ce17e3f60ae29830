//! The bad-input table of docs/api.md, over real HTTP: every row gets its documented status and
//! problem type, and none of them consumes the key or leaves a row behind.

use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::api_support::{order, TestApi, ALICE};

const KEY: &str = "bad-input-key";

struct Case {
    name: &'static str,
    token: Option<&'static str>,
    headers: Vec<(&'static str, Vec<u8>)>,
    body: Vec<u8>,
    status: u16,
    problem: &'static str,
}

fn json_headers() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("idempotency-key", KEY.as_bytes().to_vec()),
        ("content-type", b"application/json".to_vec()),
    ]
}

fn case(name: &'static str, body: serde_json::Value, problem: &'static str) -> Case {
    Case {
        name,
        token: Some(ALICE),
        headers: json_headers(),
        body: body.to_string().into_bytes(),
        status: 400,
        problem,
    }
}

fn with_field(field: &str, value: serde_json::Value) -> serde_json::Value {
    let mut body = order("req-bad");
    body[field] = value;
    body
}

fn with_key(name: &'static str, key: Vec<u8>) -> Case {
    let mut headers = json_headers();
    headers[0].1 = key;
    Case {
        name,
        token: Some(ALICE),
        headers,
        body: order("req-bad").to_string().into_bytes(),
        status: 400,
        problem: "invalid-idempotency-key",
    }
}

fn cases() -> Vec<Case> {
    let good = || order("req-bad").to_string().into_bytes();
    let mut list = vec![
        Case {
            name: "oversized body",
            token: Some(ALICE),
            headers: json_headers(),
            body: with_field("metadata", json!({"pad": "x".repeat(20_000)}))
                .to_string()
                .into_bytes(),
            status: 413,
            problem: "payload-too-large",
        },
        with_key("10,000-character key", vec![b'k'; 10_000]),
        with_key("256-character key", vec![b'k'; 256]),
        with_key("empty key", Vec::new()),
        with_key("non-ASCII key", "clé".as_bytes().to_vec()),
        with_key("key with a space", b"a b".to_vec()),
        with_key("key with a tab", b"a\tb".to_vec()),
        Case {
            name: "missing key",
            token: Some(ALICE),
            headers: vec![("content-type", b"application/json".to_vec())],
            body: good(),
            status: 400,
            problem: "invalid-idempotency-key",
        },
        Case {
            name: "two keys",
            token: Some(ALICE),
            headers: [json_headers(), vec![("idempotency-key", b"other".to_vec())]].concat(),
            body: good(),
            status: 400,
            problem: "invalid-idempotency-key",
        },
        Case {
            name: "unknown Api-Version",
            token: Some(ALICE),
            headers: [json_headers(), vec![("api-version", b"1999-01-01".to_vec())]].concat(),
            body: good(),
            status: 400,
            problem: "unsupported-api-version",
        },
        Case {
            name: "text/plain",
            token: Some(ALICE),
            headers: vec![
                ("idempotency-key", KEY.as_bytes().to_vec()),
                ("content-type", b"text/plain".to_vec()),
            ],
            body: good(),
            status: 415,
            problem: "unsupported-media-type",
        },
        Case {
            name: "no content type",
            token: Some(ALICE),
            headers: vec![("idempotency-key", KEY.as_bytes().to_vec())],
            body: good(),
            status: 415,
            problem: "unsupported-media-type",
        },
        Case {
            name: "latin-1 charset",
            token: Some(ALICE),
            headers: vec![
                ("idempotency-key", KEY.as_bytes().to_vec()),
                ("content-type", b"application/json; charset=iso-8859-1".to_vec()),
            ],
            body: good(),
            status: 415,
            problem: "unsupported-media-type",
        },
        Case {
            name: "missing token",
            token: None,
            headers: json_headers(),
            body: good(),
            status: 401,
            problem: "unauthenticated",
        },
        Case {
            name: "unknown token",
            token: Some("no-such-token"),
            headers: json_headers(),
            body: good(),
            status: 401,
            problem: "unauthenticated",
        },
        Case {
            name: "raw NUL byte in the body",
            token: Some(ALICE),
            headers: json_headers(),
            body: br#"{"request_id":"a"#
                .iter()
                .chain(b"\0")
                .chain(br#"","amount":"1","item":"i","recipient":"r"}"#)
                .copied()
                .collect(),
            status: 400,
            problem: "malformed-json",
        },
        Case {
            name: "invalid UTF-8",
            token: Some(ALICE),
            headers: json_headers(),
            body: b"{\"request_id\":\"\xff\xfe\",\"amount\":\"1\",\"item\":\"i\",\"recipient\":\"r\"}"
                .to_vec(),
            status: 400,
            problem: "malformed-json",
        },
        Case {
            name: "deeply nested JSON",
            token: Some(ALICE),
            headers: json_headers(),
            body: format!("{{\"metadata\":{}", "[".repeat(8_000)).into_bytes(),
            status: 400,
            problem: "malformed-json",
        },
        Case {
            name: "duplicate JSON key",
            token: Some(ALICE),
            headers: json_headers(),
            body: br#"{"request_id":"a","amount":"1","amount":"1000","item":"i","recipient":"r"}"#
                .to_vec(),
            status: 400,
            problem: "malformed-json",
        },
        Case {
            name: "empty body",
            token: Some(ALICE),
            headers: json_headers(),
            body: Vec::new(),
            status: 400,
            problem: "malformed-json",
        },
        Case {
            name: "a JSON array",
            token: Some(ALICE),
            headers: json_headers(),
            body: b"[]".to_vec(),
            status: 400,
            problem: "malformed-json",
        },
    ];
    for (name, field, value) in [
        (
            "escaped NUL in a text field",
            "request_id",
            json!("a\u{0}b"),
        ),
        ("escaped NUL in metadata", "metadata", json!({"t": "\u{0}"})),
        ("newline in a text field", "recipient", json!("a\nb")),
        ("256-character item", "item", json!("i".repeat(256))),
        ("empty request_id", "request_id", json!("")),
        (
            "amount_minor beyond i64",
            "amount_minor",
            json!(9_223_372_036_854_775_808u64),
        ),
        ("fractional amount_minor", "amount_minor", json!(10.5)),
        ("amount as a JSON number", "amount", json!(100)),
        ("too many decimals", "amount", json!("1.001")),
        ("zero amount", "amount", json!("0.00")),
        ("negative amount", "amount", json!("-5")),
        ("exponent amount", "amount", json!("1e3")),
        ("unknown currency", "currency", json!("ZZZ")),
        ("currency without minor unit", "currency", json!("XAU")),
        ("zero quantity", "quantity", json!(0)),
        ("quantity beyond int4", "quantity", json!(2_147_483_648u64)),
        ("metadata not an object", "metadata", json!("trace")),
        ("unknown field", "colour", json!("red")),
    ] {
        let mut body = with_field(field, value);
        if field == "amount_minor" {
            body.as_object_mut().unwrap().remove("amount");
        }
        list.push(case(name, body, "validation-failed"));
    }
    list
}

#[tokio::test]
async fn every_bad_input_gets_its_documented_answer_and_consumes_nothing() {
    let api = TestApi::start().await;
    for c in cases() {
        let headers: Vec<(&str, &[u8])> =
            c.headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let r = api.post_raw(c.token, &headers, c.body.clone()).await;
        assert_eq!(r.status, c.status, "{}: {}", c.name, r.text);
        assert_eq!(r.problem(), c.problem, "{}: {}", c.name, r.text);
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{}",
            c.name
        );
    }
    assert_eq!(api.counts().await, (0, 0, 0), "no row left behind");
    // The key was never consumed.
    let ok = api.post(ALICE, KEY, &order("req-bad")).await;
    ok.expect(201);
    assert!(!ok.replayed());
}

#[tokio::test]
async fn validation_names_unknown_fields_and_lists_every_offender() {
    let api = TestApi::start().await;
    let r = api
        .post(
            ALICE,
            KEY,
            &json!({"request_id": "", "amount": "1.001", "quantity": 0, "colour": "red",
                    "recipient": "r", "item": "i"}),
        )
        .await;
    r.expect(400);
    let problem = r.json();
    let mut fields: Vec<String> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert!(e["detail"].is_string() && e["pointer"].is_string());
            e["field"].as_str().unwrap().to_owned()
        })
        .collect();
    fields.sort();
    assert_eq!(fields, ["amount", "colour", "quantity", "request_id"]);
    assert!(problem["detail"].as_str().unwrap().contains("colour"));
}

#[tokio::test]
async fn an_oversized_chunked_body_without_content_length_is_413() {
    let api = TestApi::start().await;
    let address = api.base.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "POST /v1/orders HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {ALICE}\r\n\
         Idempotency-Key: {KEY}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", 4096, "x".repeat(4096));
    // Up to 40 KiB; the server may answer and close before all of it is sent.
    for _ in 0..10 {
        if socket.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = socket.write_all(b"0\r\n\r\n").await;
    let mut response = Vec::new();
    let _ = socket.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("payload-too-large"), "{text}");
    assert_eq!(api.counts().await, (0, 0, 0));
}

#[tokio::test]
async fn sql_injection_strings_are_inert_data() {
    let api = TestApi::start().await;
    let evil = "x'); DROP TABLE orders; --";
    let key = "k';DROP/**/TABLE/**/idempotency_records;--";
    let body = json!({
        "request_id": evil, "amount": "1.00", "item": format!("{evil} item"),
        "recipient": "\" OR 1=1 --", "metadata": {"q": "'; SELECT pg_sleep(10); --"},
    });
    let r = api.post(ALICE, key, &body).await;
    r.expect(201);
    let created = r.json();
    assert_eq!(created["request_id"], evil);
    assert_eq!(created["recipient"], "\" OR 1=1 --");
    let replay = api.post(ALICE, key, &body).await;
    replay.expect(201);
    assert!(replay.replayed());
    let status = api
        .get(
            Some(ALICE),
            "/v1/idempotency-keys/k';DROP%2F**%2FTABLE%2F**%2Fidempotency_records;--",
        )
        .await;
    status.expect(200);
    assert_eq!(
        api.counts().await,
        (1, 1, 1),
        "every table still there, one row each"
    );
}

/// Sends one request as raw bytes (headers the HTTP client libraries refuse to send) and returns
/// the status line and the whole response text.
async fn raw_request(api: &TestApi, head_lines: &[u8], body: &[u8]) -> String {
    let address = api.base.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut request = format!(
        "POST /v1/orders HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(head_lines);
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(body);
    socket.write_all(&request).await.unwrap();
    let mut response = Vec::new();
    let _ = socket.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn control_characters_nul_and_raw_non_ascii_bytes_in_the_key_consume_nothing() {
    let api = TestApi::start().await;
    let body = order("req-raw").to_string();
    // Control characters never reach a handler: the HTTP parser refuses the header (a bare
    // 400). Bytes >= 0x80 are legal in a header value, so they reach the key check.
    const PARSER: Option<&str> = None;
    const KEY_CHECK: Option<&str> = Some("invalid-idempotency-key");
    for (name, key, problem) in [
        ("NUL", &b"a\x00b"[..], PARSER),
        ("SOH", b"a\x01b", PARSER),
        ("ESC", b"a\x1bb", PARSER),
        ("bare CR", b"a\rb", PARSER),
        ("DEL", b"a\x7fb", PARSER),
        ("Latin-1 byte", b"cl\xe9", KEY_CHECK),
        ("UTF-8", "clé-🔑".as_bytes(), KEY_CHECK),
    ] {
        let mut line = b"Idempotency-Key: ".to_vec();
        line.extend_from_slice(key);
        line.extend_from_slice(b"\r\n");
        let response = raw_request(&api, &line, body.as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 400 "), "{name}: {response}");
        match problem {
            Some(p) => assert!(response.contains(p), "{name}: {response}"),
            None => assert!(!response.contains("problem+json"), "{name}: {response}"),
        }
    }
    assert_eq!(api.counts().await, (0, 0, 0), "no row left behind");
    api.post(ALICE, "a-b", &order("req-raw")).await.expect(201);
}

#[tokio::test]
async fn bad_keys_in_the_key_status_path_are_400_and_other_bad_paths_404() {
    let api = TestApi::start().await;
    for (path, status, problem) in [
        ("/v1/idempotency-keys/a%00b", 400, "invalid-idempotency-key"),
        ("/v1/idempotency-keys/a%0Ab", 400, "invalid-idempotency-key"),
        ("/v1/idempotency-keys/a%7Fb", 400, "invalid-idempotency-key"),
        (
            "/v1/idempotency-keys/cl%C3%A9",
            400,
            "invalid-idempotency-key",
        ),
        (
            "/v1/idempotency-keys/%FF%FE",
            400,
            "invalid-idempotency-key",
        ),
        ("/v1/orders/%00", 404, "order-not-found"),
        (
            "/v1/orders/00000000-0000-0000-0000-000000000000'%20OR%201=1--",
            404,
            "order-not-found",
        ),
    ] {
        let r = api.get(Some(ALICE), path).await;
        assert_eq!(r.status, status, "{path}: {}", r.text);
        assert_eq!(r.problem(), problem, "{path}");
    }
    let long = format!("/v1/idempotency-keys/{}", "k".repeat(10_000));
    let r = api.get(Some(ALICE), &long).await;
    r.expect(400);
    assert_eq!(r.problem(), "invalid-idempotency-key");
}

#[tokio::test]
async fn amounts_beyond_i64_or_the_length_limit_are_refused_as_fields() {
    let api = TestApi::start().await;
    for amount in [
        "92233720368547758.08", // i64::MAX + 1 minor units
        "99999999999999999999999999999999999999",
        &format!("1{}", "0".repeat(40)),
        "1.",
        ".5",
        "+1",
        " 1",
        "1,00",
        "١٠٠", // Arabic-Indic digits
    ] {
        let mut body = order("req-big");
        body["amount"] = json!(amount);
        let r = api.post(ALICE, KEY, &body).await;
        r.expect(400);
        assert_eq!(r.problem(), "validation-failed", "{amount}");
    }
    let mut max = order("req-max");
    max.as_object_mut().unwrap().remove("amount");
    max["amount_minor"] = json!(i64::MAX);
    // Accepted as input; over alice's approval limit, which is the stored outcome of the key.
    let r = api.post(ALICE, "key-max", &max).await;
    r.expect(422);
    assert_eq!(r.problem(), "approval-limit-exceeded");
    assert_eq!(api.counts().await, (1, 0, 0));
    api.post(ALICE, KEY, &order("req-big")).await.expect(201);
}
