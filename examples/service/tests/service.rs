//! The order service end to end on real PostgreSQL and NATS: orders placed over HTTP reach the
//! broker through the relay running in the same process, a graceful stop finishes what is in
//! flight and releases the partitions, and a second start publishes the rest.

use std::{collections::BTreeSet, net::SocketAddr, process::Stdio, time::Duration};

use outbox_example_service::{
    orders::{OrderPlaced, Placed},
    Config, Service,
};
use outbox_relayer::{publishers::BrokerSettings, routing::RoutingConfig, RelayConfig};
use outbox_testkit::{unique, wait_until, NatsReader, TestDb, NATS_URL};
use reqwest::StatusCode;

const WAIT: Duration = Duration::from_secs(60);

fn config(db: &TestDb, nats: &NatsReader) -> Config {
    let mut brokers = BrokerSettings::default();
    brokers.nats.stream = nats.stream.clone();
    Config {
        database_url: db.url.clone(),
        broker_url: NATS_URL.into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        relay: RelayConfig {
            schema: db.schema.clone(),
            table: db.tables.events().as_str().to_owned(),
            poll_interval: Duration::from_millis(50),
            routing: RoutingConfig {
                default: format!("{}.{{aggregate_type}}.{{event_type}}", nats.prefix),
                ..RoutingConfig::default()
            },
            ..RelayConfig::default()
        },
        brokers,
        drain_timeout: Duration::from_secs(20),
    }
}

async fn place(client: &reqwest::Client, addr: SocketAddr, body: &str) -> (StatusCode, String) {
    let response = client
        .post(format!("http://{addr}/orders"))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("the service answers");
    (response.status(), response.text().await.unwrap())
}

async fn place_many(addr: SocketAddr, n: usize) -> Vec<Placed> {
    let client = reqwest::Client::new();
    let requests = (0..n).map(|i| {
        let client = client.clone();
        async move {
            let body = format!(
                r#"{{"customer": "c{i}", "sku": "apple", "qty": {}}}"#,
                1 + i % 3
            );
            let (status, text) = place(&client, addr, &body).await;
            assert_eq!(status, StatusCode::CREATED, "{text}");
            serde_json::from_str::<Placed>(&text).unwrap()
        }
    });
    futures::future::join_all(requests).await
}

async fn count(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar(&db.tables.render(sql))
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn orders_placed_over_http_reach_the_broker_through_the_relay_inside() {
    let db = TestDb::new(4).await;
    let prefix = unique("svc");
    let nats = NatsReader::start(NATS_URL, &prefix.to_uppercase(), &prefix).await;
    let service = Service::start(config(&db, &nats)).await.unwrap();
    let addr = service.addr();
    let client = reqwest::Client::new();

    wait_until("the relay ready", WAIT, || {
        let client = client.clone();
        async move {
            let ready = client.get(format!("http://{addr}/readyz")).send().await;
            matches!(ready, Ok(r) if r.status() == StatusCode::OK)
        }
    })
    .await;

    let placed = place_many(addr, 30).await;
    // Refused orders write nothing, neither the order nor an event.
    for (body, reason) in [
        (
            r#"{"customer": "", "sku": "apple", "qty": 1}"#,
            "customer: must not be empty",
        ),
        (
            r#"{"customer": "ada", "sku": "apple", "qty": 0}"#,
            "qty: from 1 to 1000, not 0",
        ),
        (
            r#"{"customer": "a\u0000da", "sku": "apple", "qty": 1}"#,
            "customer: must not contain NUL",
        ),
    ] {
        let (status, text) = place(&client, addr, body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(text.trim(), reason);
    }
    let (status, _) = place(&client, addr, r#"{"customer": "ada", "qty": 1}"#).await;
    assert!(status.is_client_error(), "{status}");
    assert_eq!(count(&db, "SELECT count(*) FROM {schema}.orders").await, 30);
    assert_eq!(count(&db, "SELECT count(*) FROM {schema}.events").await, 30);

    let deliveries = nats.wait_for(30, WAIT).await;
    let sent: BTreeSet<(String, String)> = placed
        .iter()
        .map(|p| (p.event_id.to_string(), p.order_id.to_string()))
        .collect();
    let received: BTreeSet<(String, String)> = deliveries
        .iter()
        .map(|d| (d.event_id.clone(), d.aggregate_id.clone()))
        .collect();
    assert_eq!(received, sent);
    for delivery in &deliveries {
        assert_eq!(delivery.destination, format!("{prefix}.order.OrderPlaced"));
        assert_eq!(delivery.headers["event-type"], "OrderPlaced");
        let event: OrderPlaced = serde_json::from_slice(&delivery.payload).unwrap();
        assert_eq!(event.order_id.to_string(), delivery.aggregate_id);
        assert_eq!(event.sku, "apple");
    }
    let metrics = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let published: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("outbox_published_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(published, 30.0, "{metrics}");

    service.stop().await.unwrap();
    nats.cleanup().await;
}

#[tokio::test]
async fn a_graceful_stop_finishes_in_flight_publishes_and_the_next_start_sends_the_rest() {
    let db = TestDb::new(4).await;
    let prefix = unique("svc");
    let nats = NatsReader::start(NATS_URL, &prefix.to_uppercase(), &prefix).await;
    let service = Service::start(config(&db, &nats)).await.unwrap();
    let placed = place_many(service.addr(), 200).await;
    // Stopped while the relay is publishing: what it claimed it finishes and records.
    service.stop().await.unwrap();

    // No partition is left held, so another relay takes over at once.
    let held = count(
        &db,
        "SELECT count(*) FROM {schema}.leases WHERE owner IS NOT NULL AND expires_at > now()",
    )
    .await;
    assert_eq!(held, 0);
    // Every row recorded as published is on the stream (G1); the others are still pending.
    let published: BTreeSet<String> = sqlx::query_scalar::<_, uuid::Uuid>(
        &db.tables
            .render("SELECT event_id FROM {schema}.events WHERE status = 'published'"),
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .map(|id| id.to_string())
    .collect();
    let pending = count(
        &db,
        "SELECT count(*) FROM {schema}.events WHERE status = 'pending'",
    )
    .await;
    assert_eq!(published.len() as i64 + pending, 200);
    let on_stream = || {
        nats.deliveries()
            .into_iter()
            .map(|d| d.event_id)
            .collect::<BTreeSet<_>>()
    };
    wait_until("every published row on the stream", WAIT, || {
        let done = published.is_subset(&on_stream());
        async move { done }
    })
    .await;

    let again = Service::start(config(&db, &nats)).await.unwrap();
    wait_until("every order published", WAIT, || async {
        count(
            &db,
            "SELECT count(*) FROM {schema}.events WHERE status <> 'published'",
        )
        .await
            == 0
    })
    .await;
    again.stop().await.unwrap();
    let expected: BTreeSet<String> = placed.iter().map(|p| p.event_id.to_string()).collect();
    wait_until("every order on the stream", WAIT, || {
        let done = on_stream() == expected;
        async move { done }
    })
    .await;
    nats.cleanup().await;
}

#[tokio::test]
async fn the_binary_stops_on_sigterm_with_status_zero() {
    let db = TestDb::new(2).await;
    let prefix = unique("svc");
    let nats = NatsReader::start(NATS_URL, &prefix.to_uppercase(), &prefix).await;
    let port = outbox_testkit::free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-service"))
        .env("DATABASE_URL", &db.url)
        .env("BROKER_URL", NATS_URL)
        .env("LISTEN", format!("127.0.0.1:{port}"))
        .env("OUTBOX_SCHEMA", &db.schema)
        .env("NATS_STREAM", &nats.stream)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = reqwest::Client::new();
    wait_until("the service listening", WAIT, || {
        let client = client.clone();
        async move {
            let ready = client.get(format!("http://{addr}/healthz")).send().await;
            matches!(ready, Ok(r) if r.status() == StatusCode::OK)
        }
    })
    .await;
    let (status, text) = place(
        &client,
        addr,
        r#"{"customer": "ada", "sku": "pear", "qty": 2}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{text}");

    let pid = child.id().expect("running").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let exit = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the service stops after SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit}");
    let held = count(
        &db,
        "SELECT count(*) FROM {schema}.leases WHERE owner IS NOT NULL AND expires_at > now()",
    )
    .await;
    assert_eq!(held, 0);
    nats.cleanup().await;
}

#[tokio::test]
async fn a_stop_does_not_wait_for_a_client_that_never_finishes_its_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = TestDb::new(2).await;
    let prefix = unique("svc");
    let nats = NatsReader::start(NATS_URL, &prefix.to_uppercase(), &prefix).await;
    let mut config = config(&db, &nats);
    config.drain_timeout = Duration::from_millis(500);
    let service = Service::start(config).await.unwrap();

    // One connection: a request served (so the server holds the connection), then a request
    // whose body never comes.
    let mut stuck = tokio::net::TcpStream::connect(service.addr())
        .await
        .unwrap();
    stuck
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: svc\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    while !answer.ends_with(b"ok\n") {
        let mut buf = [0u8; 512];
        let n = stuck.read(&mut buf).await.unwrap();
        assert!(n > 0, "the service closed the connection");
        answer.extend_from_slice(&buf[..n]);
    }
    stuck
        .write_all(
            b"POST /orders HTTP/1.1\r\nhost: svc\r\ncontent-type: application/json\r\n\
              content-length: 100\r\n\r\n{\"customer\"",
        )
        .await
        .unwrap();

    tokio::time::timeout(WAIT, service.stop())
        .await
        .expect("the stop ends without the stuck request")
        .unwrap();
    let held = count(
        &db,
        "SELECT count(*) FROM {schema}.leases WHERE owner IS NOT NULL AND expires_at > now()",
    )
    .await;
    assert_eq!(held, 0);
    assert_eq!(count(&db, "SELECT count(*) FROM {schema}.orders").await, 0);
    drop(stuck);
    nats.cleanup().await;
}
