//! Event data steering the webhook publisher, from outside: rows inserted by plain SQL (any
//! writer may), the relay running against raw TCP receivers on loopback that record each
//! request's request line, every header as it arrived (duplicates included) and the body.
//! A hostile destination stays one encoded path segment under the configured path, a redirect
//! is not followed, the writer's headers cannot forge or repeat the relay's or the
//! transport's, and no request carries a `Referer`.

mod common;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use outbox_relayer::publishers::{
    self,
    webhook::{sign, WebhookConfig, WebhookPublisher},
    BrokerSettings,
};
use outbox_testkit::{unique, wait_until, TestDb};
use serde_json::json;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpListener,
};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// A signing secret in the Standard Webhooks form.
const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// One request as it arrived on the socket.
#[derive(Clone, Debug)]
struct Raw {
    /// `POST /path HTTP/1.1`.
    line: String,
    /// Every header line, in order, names as sent.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    /// The request target of the request line.
    fn target(&self) -> &str {
        self.line.split(' ').nth(1).unwrap_or_default()
    }

    /// Every value of header `name`, in any case.
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// A raw HTTP/1.1 receiver: records every request and answers each with `answer` (a status
/// line's code and reason plus any extra header lines).
#[derive(Clone)]
struct Receiver {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<Raw>>>,
}

impl Receiver {
    async fn start(answer: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let (read, mut write) = socket.into_split();
                    let mut read = BufReader::new(read);
                    while let Some(raw) = read_request(&mut read).await {
                        log.lock().unwrap().push(raw);
                        let response = format!("HTTP/1.1 {answer}\r\ncontent-length: 0\r\n\r\n");
                        if write.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { addr, seen }
    }

    fn seen(&self) -> Vec<Raw> {
        self.seen.lock().unwrap().clone()
    }
}

/// Reads one request (a body framed by `content-length`), or `None` at the end of the stream.
async fn read_request(read: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Option<Raw> {
    let mut line = String::new();
    if read.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        read.read_line(&mut header).await.ok()?;
        let header = header.trim_end_matches(['\r', '\n']);
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.push((name.to_owned(), value.trim().to_owned()));
    }
    let length = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    read.read_exact(&mut body).await.ok()?;
    Some(Raw {
        line: line.trim_end().to_owned(),
        headers,
        body,
    })
}

/// Inserts one event as a writer would with plain SQL; returns its event id.
async fn insert(
    db: &TestDb,
    aggregate: &str,
    destination: &str,
    headers: serde_json::Value,
) -> Uuid {
    let event_id = Uuid::now_v7();
    let sql = db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
         destination, payload, content_type, headers) VALUES ($1, 'order', $2, 'Placed', $3, \
         $4, 'application/json', $5::text::jsonb)",
    );
    sqlx::query(&sql)
        .bind(event_id)
        .bind(aggregate)
        .bind(destination)
        .bind(&br#"{"n":1}"#[..])
        .bind(headers.to_string())
        .execute(&db.pool)
        .await
        .expect("insert");
    event_id
}

/// The status and last error of the event `event_id`.
async fn row(db: &TestDb, event_id: Uuid) -> (String, Option<String>) {
    sqlx::query_as(
        &db.tables
            .render("SELECT status, last_error FROM {schema}.{events} WHERE event_id = $1"),
    )
    .bind(event_id)
    .fetch_one(&db.pool)
    .await
    .expect("row")
}

/// Waits until the event reaches `status`; returns its last error.
async fn settled(db: &TestDb, event_id: Uuid, status: &str) -> Option<String> {
    wait_until(&format!("{event_id} to be {status}"), WAIT, || async {
        row(db, event_id).await.0 == status
    })
    .await;
    row(db, event_id).await.1
}

/// The publisher for `url`, signing with [`SECRET`] when `signed`.
fn publisher(url: String, signed: bool) -> Arc<WebhookPublisher> {
    let secrets = if signed { json!([SECRET]) } else { json!([]) };
    let config: WebhookConfig =
        serde_json::from_value(json!({ "url": url, "secrets": secrets, "timeout": "5s" }))
            .expect("webhook config");
    Arc::new(WebhookPublisher::new(config).expect("webhook publisher"))
}

fn assert_no_referer(requests: &[Raw]) {
    for r in requests {
        assert!(r.all("referer").is_empty(), "a Referer on {r:?}");
    }
}

#[tokio::test]
async fn a_hostile_destination_stays_one_encoded_segment_under_the_configured_path() {
    let db = TestDb::new(4).await;
    let receiver = Receiver::start("204 No Content").await;
    let url = format!("http://{}/hooks/in/{{destination}}", receiver.addr);
    let cases = [
        (
            "../../admin/delete?all=true&x=",
            "/hooks/in/..%2F..%2Fadmin%2Fdelete%3Fall%3Dtrue%26x%3D",
        ),
        ("%2e%2e/", "/hooks/in/%252e%252e%2F"),
        ("a#b", "/hooks/in/a%23b"),
        ("a/b", "/hooks/in/a%2Fb"),
    ];
    let mut sent = Vec::new();
    for (i, (destination, target)) in cases.iter().enumerate() {
        sent.push((
            insert(&db, &format!("a{i}"), destination, json!({})).await,
            *target,
        ));
    }
    let dots = insert(&db, "dots", "..", json!({})).await;
    let relay = common::start(
        &db,
        publisher(url, false),
        common::fast_config(&db, &unique("p")),
    )
    .await;
    for (event_id, _) in &sent {
        settled(&db, *event_id, "published").await;
    }
    let reason = settled(&db, dots, "dead").await.unwrap_or_default();
    relay.shutdown().await.unwrap();

    assert!(reason.contains("dot-segment"), "{reason}");
    let seen = receiver.seen();
    assert_eq!(seen.len(), cases.len(), "nothing else requested: {seen:#?}");
    for (event_id, target) in sent {
        let request = seen
            .iter()
            .find(|r| r.all("event-id") == [event_id.to_string()])
            .expect("the event's request");
        assert_eq!(request.target(), target);
        assert_eq!(request.line, format!("POST {target} HTTP/1.1"));
    }
    assert_no_referer(&seen);
}

#[tokio::test]
async fn a_template_with_the_destination_in_the_host_fails_at_startup_naming_it() {
    // User info is hidden in errors (it may hold a password): the template is named without it.
    for (template, shown, part) in [
        (
            "http://{destination}.internal.example/x",
            "http://{destination}.internal.example/x",
            "host",
        ),
        (
            "http://{destination}@internal.example/x",
            "http://***@internal.example/x",
            "user info",
        ),
    ] {
        let err = publishers::connect(template, BrokerSettings::default())
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains(&format!("webhook.url: `{shown}`")), "{err}");
        assert!(err.contains(part), "{err}");
    }
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_the_event_is_not_marked_published() {
    let db = TestDb::new(4).await;
    let elsewhere = Receiver::start("204 No Content").await;
    // The answer needs the second receiver's address: leak one string per test run.
    let answer: &'static str = Box::leak(
        format!(
            "307 Temporary Redirect\r\nlocation: http://{}/stolen",
            elsewhere.addr
        )
        .into_boxed_str(),
    );
    let redirecting = Receiver::start(answer).await;
    let url = format!("http://{}/hooks/{{destination}}", redirecting.addr);
    let event_id = insert(&db, "r1", "orders", json!({})).await;
    let relay = common::start(
        &db,
        publisher(url, true),
        common::fast_config(&db, &unique("p")),
    )
    .await;
    let reason = settled(&db, event_id, "dead").await.unwrap_or_default();
    relay.shutdown().await.unwrap();

    assert!(elsewhere.seen().is_empty(), "{:#?}", elsewhere.seen());
    assert!(reason.contains("307"), "{reason}");
    assert!(reason.contains("redirects are not followed"), "{reason}");
    let seen = redirecting.seen();
    assert_eq!(seen.len(), 3, "a permanent failure, max_attempts times");
    assert_no_referer(&seen);
}

#[tokio::test]
async fn writer_headers_cannot_forge_or_repeat_the_relays_or_the_transports() {
    let db = TestDb::new(4).await;
    let receiver = Receiver::start("204 No Content").await;
    let url = format!("http://{}/hooks/{{destination}}", receiver.addr);
    let event_id = insert(
        &db,
        "h1",
        "orders",
        json!({
            "Event-Id": "forged",
            "Host": "internal.admin.local",
            "IDEMPOTENCY-KEY": "x",
            "Webhook-Signature": "v1,forged",
            "Webhook-Timestamp": "1",
            "Authorization": "Bearer forged",
            "X-Tenant": "t1",
        }),
    )
    .await;
    let relay = common::start(
        &db,
        publisher(url, true),
        common::fast_config(&db, &unique("p")),
    )
    .await;
    settled(&db, event_id, "published").await;
    relay.shutdown().await.unwrap();

    let seen = receiver.seen();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let request = &seen[0];
    let id = event_id.to_string();
    let one = |name: &str| {
        let values = request.all(name);
        assert_eq!(values.len(), 1, "{name}: {:#?}", request.headers);
        values[0].to_owned()
    };
    assert_eq!(one("event-id"), id);
    assert_eq!(one("idempotency-key"), id);
    assert_eq!(one("webhook-id"), id);
    assert_eq!(one("host"), receiver.addr.to_string());
    assert_eq!(one("x-tenant"), "t1");
    let timestamp: i64 = one("webhook-timestamp").parse().expect("unix seconds");
    assert_eq!(
        one("webhook-signature"),
        sign(&[SECRET.to_owned()], &id, timestamp, &request.body).unwrap()
    );
    assert!(request.all("authorization").is_empty());
    let mut names: Vec<String> = request
        .headers
        .iter()
        .map(|(k, _)| k.to_ascii_lowercase())
        .collect();
    let before = names.len();
    names.sort();
    names.dedup();
    assert_eq!(
        names.len(),
        before,
        "every header once: {:#?}",
        request.headers
    );
    assert_no_referer(&seen);
}
