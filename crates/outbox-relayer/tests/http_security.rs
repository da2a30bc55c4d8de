//! The relay's HTTP API as someone who reaches its port sees it: raw HTTP requests against the
//! dashboard and metrics routers served on a real listener, rows put in by SQL. Reads need a
//! token beyond loopback, only allowed `Host`s are answered, the dead-letter listing is
//! bounded whatever the rows hold and never shows a credential a writer stored, and every
//! response carries the security headers.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use outbox_relayer::{
    admin::{Admin, DeadLetterFilter},
    dashboard::{self, Dashboard, MAX_LIST_LIMIT},
    health::Health,
    http,
    postgres::PgStore,
    telemetry::Metrics,
};
use outbox_testkit::{MySqlDb, SqliteFile, TestDb};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ADMIN: &str = "adm1n-token-for-tests";
const READER: &str = "r3ad-token-for-tests";

/// Who may do what on a served dashboard.
#[derive(Default)]
struct Access {
    /// Bind 0.0.0.0 (beyond loopback) instead of 127.0.0.1.
    everywhere: bool,
    admin_token: Option<&'static str>,
    read_token: Option<&'static str>,
    allowed_hosts: Vec<String>,
}

/// Serves the dashboard of `db` and the metrics endpoints, as `outbox relay` does on one
/// listener; returns the address to connect to (loopback, whatever was bound).
async fn serve(db: &TestDb, access: Access) -> String {
    let ip = if access.everywhere {
        [0, 0, 0, 0]
    } else {
        [127, 0, 0, 1]
    };
    let listener = tokio::net::TcpListener::bind(SocketAddr::from((ip, 0)))
        .await
        .unwrap();
    let listen = listener.local_addr().unwrap();
    let metrics = Arc::new(Metrics::new());
    let board = dashboard::router(Dashboard {
        admin: Admin::new(db.pool.clone(), &db.tables),
        store: Arc::new(PgStore::open(db.pool.clone(), &db.tables).await.unwrap()),
        metrics: metrics.clone(),
        token: access.admin_token.map(str::to_owned),
        read_token: access.read_token.map(str::to_owned),
        listen,
        allowed_hosts: access.allowed_hosts,
    });
    let health = Arc::new(Health::new(Duration::from_secs(60)));
    let router = http::router(metrics, health).merge(board);
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("127.0.0.1:{}", listen.port())
}

/// A response: status, headers (names lower case), body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One raw HTTP/1.0 request to `addr` with `Host: host`.
async fn request(
    addr: &str,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut text = format!(
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    stream.write_all(text.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// GET `path` with the `Host` a browser on this machine sends.
async fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    request(addr, addr, "GET", path, headers, "").await
}

/// Adds a dead letter by SQL, its destination, headers and last error given as SQL
/// expressions.
async fn dead_row(db: &TestDb, destination: &str, headers: &str, last_error: &str) {
    db.exec(&format!(
        "INSERT INTO {{schema}}.{{events}} (event_id, aggregate_type, aggregate_id, event_type,
             destination, payload, headers, status, attempts, last_error)
         VALUES (gen_random_uuid(), 'order', 'o-1', 'Placed', {destination}, '\\x7b7d',
                 {headers}, 'dead', 5, {last_error})"
    ))
    .await;
}

#[tokio::test]
async fn reads_beyond_loopback_need_a_token_and_are_refused_without_one() {
    let db = TestDb::new(2).await;
    let open = serve(
        &db,
        Access {
            everywhere: true,
            ..Default::default()
        },
    )
    .await;
    for path in ["/api/status", "/api/dead-letters"] {
        let reply = get(&open, path, &[]).await;
        assert_eq!(reply.status, 403, "{path}: {}", reply.body);
        assert!(
            reply.body.contains("read_token"),
            "names the setting: {}",
            reply.body
        );
    }
    // Probes and scrapers need no token.
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(get(&open, path, &[]).await.status, 200, "{path}");
    }

    let guarded = serve(
        &db,
        Access {
            everywhere: true,
            admin_token: Some(ADMIN),
            read_token: Some(READER),
            ..Default::default()
        },
    )
    .await;
    let reply = get(&guarded, "/api/dead-letters", &[]).await;
    assert_eq!(reply.status, 401, "{}", reply.body);
    assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
    let wrong = get(&guarded, "/api/status", &[("authorization", "Bearer nope")]).await;
    assert_eq!(wrong.status, 401);
    for token in [READER, ADMIN] {
        let auth = format!("Bearer {token}");
        let reply = get(&guarded, "/api/status", &[("authorization", &auth)]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(!reply.body.contains(ADMIN) && !reply.body.contains(READER));
    }
    // The read token does not act.
    let auth = format!("Bearer {READER}");
    let reply = request(
        &guarded,
        &guarded,
        "POST",
        "/api/dead-letters/skip",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        r#"{"ids":[1],"reason":"tested"}"#,
    )
    .await;
    assert_eq!(reply.status, 401, "{}", reply.body);

    // On loopback, reads are open unless a read token is set.
    let local = serve(&db, Access::default()).await;
    assert_eq!(get(&local, "/api/status", &[]).await.status, 200);
    let local_guarded = serve(
        &db,
        Access {
            read_token: Some(READER),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(get(&local_guarded, "/api/status", &[]).await.status, 401);
    // A loopback listener that answers a proxy's name serves callers beyond loopback.
    let proxied = serve(
        &db,
        Access {
            allowed_hosts: vec!["relay.example.com".into()],
            ..Default::default()
        },
    )
    .await;
    for host in ["relay.example.com", "127.0.0.1"] {
        let reply = get(&proxied, "/api/dead-letters", &[("host", host)]).await;
        assert_eq!(reply.status, 403, "{host}: {}", reply.body);
        assert!(reply.body.contains("allowed_hosts"), "{}", reply.body);
    }
}

#[tokio::test]
async fn a_request_naming_another_host_is_refused_except_by_probes_and_scrapers() {
    let db = TestDb::new(2).await;
    let addr = serve(
        &db,
        Access {
            admin_token: Some(ADMIN),
            allowed_hosts: vec!["relay.internal".into()],
            ..Default::default()
        },
    )
    .await;
    let auth = format!("Bearer {ADMIN}");
    for path in ["/", "/api/status", "/api/dead-letters", "/dashboard.js"] {
        let reply = request(&addr, "evil.example", "GET", path, &[], "").await;
        assert_eq!(reply.status, 421, "{path}: {}", reply.body);
        assert!(reply.body.contains("allowed_hosts"), "{}", reply.body);
    }
    let reply = request(
        &addr,
        "evil.example:9187",
        "POST",
        "/api/dead-letters/replay",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        r#"{"ids":[1],"reason":"tested"}"#,
    )
    .await;
    assert_eq!(reply.status, 421, "{}", reply.body);
    let port = addr.rsplit_once(':').unwrap().1;
    for host in [
        addr.clone(),
        format!("localhost:{port}"),
        "localhost".into(),
        format!("[::1]:{port}"),
        "Relay.Internal".into(),
    ] {
        // With a name in allowed_hosts, reads need a token even on loopback.
        let reply = request(
            &addr,
            &host,
            "GET",
            "/api/status",
            &[("authorization", &auth)],
            "",
        )
        .await;
        assert_eq!(reply.status, 200, "{host}: {}", reply.body);
    }
    // Kubernetes probes send the pod's IP, Prometheus the target's address.
    for path in ["/metrics", "/healthz", "/readyz"] {
        let reply = request(&addr, "10.12.0.7:9187", "GET", path, &[], "").await;
        assert_eq!(reply.status, 200, "{path}");
    }
}

#[tokio::test]
async fn every_dashboard_response_carries_the_security_headers() {
    let db = TestDb::new(2).await;
    let addr = serve(&db, Access::default()).await;
    let checks: [(&str, &str, u16); 5] = [
        ("GET", "/", 200),
        ("GET", "/dashboard.js", 200),
        ("GET", "/api/status", 200),
        ("GET", "/api/dead-letters", 200),
        ("POST", "/api/dead-letters/skip", 403),
    ];
    for (method, path, status) in checks {
        let reply = request(&addr, &addr, method, path, &[], "").await;
        assert_eq!(reply.status, status, "{path}: {}", reply.body);
        assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(reply.header("x-frame-options"), Some("DENY"));
        assert_eq!(reply.header("referrer-policy"), Some("no-referrer"));
        let csp = reply.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        let cache = reply.header("cache-control");
        if path.starts_with("/api/") {
            assert_eq!(cache, Some("no-store"), "{path}");
        }
    }
    // The policy allows no inline code: the page has none.
    let page = get(&addr, "/", &[]).await.body;
    assert!(
        !page.contains("<script>") && !page.contains("<style"),
        "{page}"
    );
    for inline in ["style=", "onclick=", "onload=", "javascript:"] {
        assert!(!page.contains(inline), "{inline} in the page");
    }
    let refused = request(&addr, "evil.example", "GET", "/api/status", &[], "").await;
    assert_eq!(
        refused.header("x-frame-options"),
        Some("DENY"),
        "on refusals too"
    );
}

#[tokio::test]
async fn a_dead_letter_of_megabytes_is_listed_cut_in_a_bounded_body() {
    let db = TestDb::new(2).await;
    let five_mb = 5 * 1024 * 1024;
    dead_row(
        &db,
        &format!("repeat('d', {five_mb})"),
        &format!("jsonb_build_object('x-big', repeat('h', {five_mb}))"),
        &format!("repeat('e', {five_mb})"),
    )
    .await;
    dead_row(
        &db,
        "'orders'",
        "jsonb_build_object('x-long', repeat('v', 10000), 'tenant', 't1')",
        "'permanent: too large'",
    )
    .await;
    let addr = serve(&db, Access::default()).await;
    let reply = get(&addr, "/api/dead-letters", &[]).await;
    assert_eq!(reply.status, 200);
    assert!(
        reply.body.len() < 16 * 1024,
        "two rows of megabytes listed in {} bytes",
        reply.body.len()
    );
    let list = reply.json();
    let huge = &list[0];
    assert_eq!(huge["destination"].as_str().unwrap().len(), 1024);
    assert_eq!(huge["last_error"].as_str().unwrap().len(), 4096);
    assert!(huge["headers"].as_str().unwrap().starts_with("[not shown"));
    let cut: Vec<&str> = huge["truncated"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for field in ["destination", "last_error", "headers"] {
        assert!(cut.contains(&field), "{field} in {cut:?}");
    }
    let long = &list[1];
    assert_eq!(long["headers"]["x-long"].as_str().unwrap().len(), 256);
    assert_eq!(long["headers"]["tenant"], "t1");
    assert_eq!(long["truncated"], serde_json::json!(["headers"]));
    assert_eq!(long["destination"], "orders");
}

#[tokio::test]
async fn the_listing_limit_is_capped() {
    let db = TestDb::new(2).await;
    db.exec(&format!(
        "INSERT INTO {{schema}}.{{events}} (event_id, aggregate_type, aggregate_id, event_type,
             payload, status, attempts, last_error)
         SELECT gen_random_uuid(), 'order', 'o-' || n, 'Placed', '\\x7b7d', 'dead', 5, 'x'
         FROM generate_series(1, {}) n",
        MAX_LIST_LIMIT + 50
    ))
    .await;
    let addr = serve(&db, Access::default()).await;
    let reply = get(&addr, "/api/dead-letters?limit=100000", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json().as_array().unwrap().len(),
        MAX_LIST_LIMIT as usize
    );
}

#[tokio::test]
async fn stored_credentials_in_headers_are_listed_redacted() {
    let db = TestDb::new(2).await;
    dead_row(
        &db,
        "NULL",
        r#"'{"Authorization": "Bearer s3cret-1", "X-Session-Token": "s3cret-2",
             "cookie": "s3cret-3", "stripe-signature": "s3cret-4",
             "meta": {"client_secret": "s3cret-5"}, "traceparent": "00-abc-01"}'"#,
        "'permanent: unroutable'",
    )
    .await;
    let addr = serve(&db, Access::default()).await;
    let reply = get(&addr, "/api/dead-letters", &[]).await;
    assert_eq!(reply.status, 200);
    assert!(!reply.body.contains("s3cret"), "{}", reply.body);
    let headers = &reply.json()[0]["headers"];
    for name in [
        "Authorization",
        "X-Session-Token",
        "cookie",
        "stripe-signature",
    ] {
        assert_eq!(headers[name], "[redacted]", "{name}: {headers}");
    }
    assert_eq!(headers["meta"]["client_secret"], "[redacted]");
    assert_eq!(headers["traceparent"], "00-abc-01");
}

/// What MySQL and SQLite list of the same hostile rows, as JSON (what the API and
/// `outbox dead-letters list --json` show): cut and redacted as on PostgreSQL.
fn check_hostile_listing(list: &[outbox_relayer::admin::DeadLetter]) {
    let text = serde_json::to_string(list).unwrap();
    assert!(text.len() < 16 * 1024, "{} bytes", text.len());
    assert!(!text.contains("s3cret"), "{text}");
    let list: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2);
    assert_eq!(
        list[0]["last_error"].as_str().unwrap().chars().count(),
        4096
    );
    assert_eq!(
        list[0]["truncated"],
        serde_json::json!(["headers", "last_error"])
    );
    assert_eq!(list[1]["headers"]["authorization"], "[redacted]");
    assert_eq!(list[1]["headers"]["x-api-key"], "[redacted]");
    assert_eq!(list[1]["headers"]["tenant"], "t1");
}

#[tokio::test]
async fn mysql_lists_hostile_rows_cut_and_redacted() {
    let db = MySqlDb::new(2).await;
    let mb = 1024 * 1024;
    db.exec(&format!(
        "INSERT INTO {{events}} (event_id, aggregate_type, aggregate_id, event_type, payload,
             headers, status, attempts, last_error)
         VALUES (UUID(), 'order', 'o-1', 'Placed', '{{}}',
                 JSON_OBJECT('x-big', REPEAT('h', {mb})), 'dead', 5, REPEAT('e', 60000)),
                (UUID(), 'order', 'o-2', 'Placed', '{{}}',
                 '{{\"authorization\": \"Bearer s3cret\", \"x-api-key\": \"s3cret\",
                    \"tenant\": \"t1\"}}', 'dead', 5, 'permanent')"
    ))
    .await;
    let admin = Admin::mysql(db.pool.clone(), &db.tables);
    check_hostile_listing(
        &admin
            .dead_letters(&DeadLetterFilter::default())
            .await
            .unwrap(),
    );
}

#[tokio::test]
async fn sqlite_lists_hostile_rows_cut_and_redacted() {
    let db = SqliteFile::new().await;
    let mb = 1024 * 1024;
    sqlx::raw_sql(&db.tables.render_sqlite(&format!(
        "INSERT INTO {{events}} (event_id, aggregate_type, aggregate_id, event_type, payload,
             headers, status, attempts, last_error)
         VALUES ('0192f0c4-7d1e-7b3a-9c55-1d2e3f405101', 'order', 'o-1', 'Placed', '{{}}',
                 json_object('x-big', replace(hex(zeroblob({mb})), '00', 'h')), 'dead', 5,
                 replace(hex(zeroblob(60000)), '00', 'e')),
                ('0192f0c4-7d1e-7b3a-9c55-1d2e3f405102', 'order', 'o-2', 'Placed', '{{}}',
                 '{{\"authorization\": \"Bearer s3cret\", \"x-api-key\": \"s3cret\",
                    \"tenant\": \"t1\"}}', 'dead', 5, 'permanent')"
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    let admin = Admin::sqlite(db.pool.clone(), &db.tables);
    check_hostile_listing(
        &admin
            .dead_letters(&DeadLetterFilter::default())
            .await
            .unwrap(),
    );
}
