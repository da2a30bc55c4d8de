//! The dashboard's mutating API checks who is asking before it looks at what is asked: a caller
//! without the token learns nothing about the body it sent, and one with the token is told what
//! is wrong with it.

use std::sync::Arc;

use outbox_relayer::{
    admin::Admin,
    dashboard::{self, Dashboard},
    postgres::PgStore,
    telemetry::Metrics,
};
use outbox_testkit::TestDb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "t0ken-for-tests";

/// Serves the dashboard of `db` with `token` on a free loopback port; returns its address.
async fn serve(db: &TestDb, token: Option<&str>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listen = listener.local_addr().unwrap();
    let addr = listen.to_string();
    let router = dashboard::router(Dashboard {
        admin: Admin::new(db.pool.clone(), &db.tables),
        store: Arc::new(PgStore::open(db.pool.clone(), &db.tables).await.unwrap()),
        metrics: Arc::new(Metrics::new()),
        token: token.map(str::to_owned),
        read_token: None,
        listen,
        allowed_hosts: Vec::new(),
    });
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// Sends one HTTP/1.0 POST with a JSON content type; returns the status and the body.
async fn post(addr: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!(
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let body = response.split_once("\r\n\r\n").map(|x| x.1.to_owned());
    (status, body.unwrap_or_default())
}

/// Well-formed JSON of the wrong shape: `ids` is not a list and `reason` is missing.
const WRONG_SHAPE: &str = r#"{"ids":"all"}"#;

#[tokio::test]
async fn a_caller_without_the_token_is_refused_before_its_body_is_read() {
    let db = TestDb::new(2).await;
    let addr = serve(&db, Some(TOKEN)).await;
    let auth = format!("Bearer {TOKEN}");
    let good = ("authorization", auth.as_str());
    for path in ["/api/dead-letters/replay", "/api/dead-letters/skip"] {
        for body in [WRONG_SHAPE, "{not json", ""] {
            let (status, reply) = post(&addr, path, &[], body).await;
            assert_eq!((status, path, body), (401, path, body), "no token: {reply}");
            let wrong = ("authorization", "Bearer nope");
            let (status, reply) = post(&addr, path, &[wrong], body).await;
            assert_eq!(
                (status, path, body),
                (401, path, body),
                "wrong token: {reply}"
            );
            let evil = ("origin", "http://evil.example");
            let (status, reply) = post(&addr, path, &[good, evil], body).await;
            assert_eq!(
                (status, path, body),
                (403, path, body),
                "cross-origin: {reply}"
            );
        }
    }
}

#[tokio::test]
async fn a_read_only_dashboard_refuses_every_action_whatever_its_body() {
    let db = TestDb::new(2).await;
    let addr = serve(&db, None).await;
    for path in ["/api/dead-letters/replay", "/api/dead-letters/skip"] {
        for body in [WRONG_SHAPE, "{not json", r#"{"ids":[1],"reason":"tested"}"#] {
            let (status, reply) = post(&addr, path, &[], body).await;
            assert_eq!((status, path, body), (403, path, body), "{reply}");
            assert!(reply.contains("read-only"), "{reply}");
        }
    }
}

#[tokio::test]
async fn with_the_token_a_malformed_body_is_refused_with_what_is_wrong() {
    let db = TestDb::new(2).await;
    let addr = serve(&db, Some(TOKEN)).await;
    let auth = format!("Bearer {TOKEN}");
    let good = ("authorization", auth.as_str());
    let path = "/api/dead-letters/replay";
    let (status, reply) = post(&addr, path, &[good], WRONG_SHAPE).await;
    assert_eq!(status, 422, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).expect("a JSON error");
    let message = reply["error"].as_str().expect("an error message");
    assert!(message.contains("ids"), "names the field: {message}");
    let (status, reply) = post(&addr, path, &[good], "{not json").await;
    assert_eq!(status, 400, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).expect("a JSON error");
    assert!(reply["error"].as_str().is_some(), "{reply}");
    let (status, reply) = post(&addr, path, &[good], r#"{"ids":[],"reason":"x"}"#).await;
    assert_eq!(status, 400, "{reply}");
    assert!(reply.contains("ids: give 1 to 10000 row ids"), "{reply}");
}
