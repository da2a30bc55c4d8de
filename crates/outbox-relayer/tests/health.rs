//! What the relay says about itself, held against what it is doing (G7): the lag gauge and
//! the backlog on an idle outbox and on a stuck event, `/readyz` and `outbox_ready` when claims
//! cannot get through, and leases that a relay keeps while its claims hold every connection.

mod common;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::future::BoxFuture;
use outbox::{Event, Outbox};
use outbox_relayer::{postgres::PgStore, Message, PublishError, Publisher, Relay};
use outbox_testkit::{unique, wait_until, TestDb};
use sqlx::{postgres::PgPoolOptions, Executor};

/// Acknowledges everything, except that it fails transiently while `failing` is set.
#[derive(Default)]
struct Switch {
    failing: AtomicBool,
}

impl Publisher for Switch {
    fn publish<'a>(&'a self, _: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        let failing = self.failing.load(Ordering::SeqCst);
        Box::pin(async move {
            if failing {
                Err(PublishError::transient("broker unavailable"))
            } else {
                Ok(())
            }
        })
    }
    fn name(&self) -> &'static str {
        "switch"
    }
    fn max_payload_bytes(&self) -> usize {
        1 << 20
    }
}

async fn write(db: &TestDb, aggregate: &str, n: usize) {
    let events: Vec<Event> = (0..n)
        .map(|i| {
            Event::new("order", format!("{aggregate}{i}"), "Placed")
                .payload(b"{}".to_vec(), "application/json")
        })
        .collect();
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox().enqueue_batch(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
}

/// The metric's value in the relay's exposition.
fn gauge(relay_metrics: &outbox_relayer::telemetry::Metrics, series: &str) -> f64 {
    relay_metrics.sum(series)
}

#[tokio::test]
async fn the_lag_gauge_reads_zero_when_idle_and_grows_while_an_event_is_stuck() {
    let db = TestDb::new(2).await;
    let store = PgStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let idle = store.backlog().await.unwrap();
    assert_eq!(
        (idle.pending, idle.oldest_age, idle.dead),
        (0, None, 0),
        "an empty outbox has no oldest pending event"
    );

    let publisher = Arc::new(Switch::default());
    publisher.failing.store(true, Ordering::SeqCst);
    let config = common::fast_config(&db, &unique("p"));
    let relay = Relay::builder(db.pool.clone(), publisher.clone(), config)
        .build()
        .await
        .unwrap();
    let metrics = relay.metrics();
    let relay = relay.spawn();
    write(&db, "stuck", 1).await;
    wait_until(
        "the gauge to see the stuck event",
        Duration::from_secs(20),
        || async {
            gauge(&metrics, "outbox_pending_events") == 1.0
                && gauge(&metrics, "outbox_oldest_pending_age_seconds") >= 1.0
        },
    )
    .await;
    let first = gauge(&metrics, "outbox_oldest_pending_age_seconds");
    assert!(
        first < 60.0,
        "the age of an event written just now: {first}"
    );
    wait_until("the gauge to grow", Duration::from_secs(20), || async {
        gauge(&metrics, "outbox_oldest_pending_age_seconds") >= first + 1.0
    })
    .await;

    publisher.failing.store(false, Ordering::SeqCst);
    // Published: the gauge falls back to 0 (it read 212,662,945,670 s, 4714 BC, before).
    wait_until(
        "the gauge to read 0 on the drained outbox",
        Duration::from_secs(20),
        || async {
            gauge(&metrics, "outbox_pending_events") == 0.0
                && gauge(&metrics, "outbox_oldest_pending_age_seconds") == 0.0
        },
    )
    .await;
    assert_eq!(db.count("published").await, 1);
    let drained = store.backlog().await.unwrap();
    assert_eq!((drained.pending, drained.oldest_age), (0, None));
    let partitions = store.partition_status().await.unwrap();
    assert!(partitions
        .iter()
        .all(|p| p.pending == 0 && p.oldest_age_seconds.is_none()));
    relay.shutdown().await.unwrap();
}

/// The whole HTTP/1.0 answer (status line, headers, body) to `GET path`.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

/// The status code of an HTTP answer.
fn status(answer: &str) -> &str {
    answer.split_whitespace().nth(1).unwrap_or_default()
}

/// A session that holds `ACCESS EXCLUSIVE` on the holds table (every claim reads it) until
/// [`unlock`], as a migration or a manual `LOCK TABLE` would. Its own connection, closed by
/// `unlock` (a pooled one would go back to the pool with the transaction open).
async fn lock_holds(db: &TestDb) -> sqlx::PgConnection {
    use sqlx::Connection;
    let mut locker = sqlx::PgConnection::connect(&db.url).await.unwrap();
    locker.execute("BEGIN").await.unwrap();
    locker
        .execute(sqlx::raw_sql(
            &db.tables
                .render("LOCK TABLE {schema}.holds IN ACCESS EXCLUSIVE MODE"),
        ))
        .await
        .unwrap();
    locker
}

async fn unlock(locker: sqlx::PgConnection) {
    use sqlx::Connection;
    locker.close().await.unwrap();
}

#[tokio::test]
async fn readiness_fails_while_claims_are_blocked_with_work_pending_and_recovers() {
    let db = TestDb::new(2).await;
    let mut config = common::fast_config(&db, &unique("p"));
    config.stall_timeout = Duration::from_secs(2);
    config.lock_timeout = Duration::from_millis(300);
    let relay = Relay::builder(db.pool.clone(), Arc::new(Switch::default()), config)
        .build()
        .await
        .unwrap();
    let (health, metrics) = (relay.health(), relay.metrics());
    let relay = relay.spawn();
    wait_until(
        "the relay to own its partitions",
        Duration::from_secs(10),
        || async { gauge(&metrics, "outbox_partitions_owned") == 2.0 },
    )
    .await;
    let served = tokio_util::sync::CancellationToken::new();
    let (addr, _server) = outbox_relayer::http::serve(
        "127.0.0.1:0".parse().unwrap(),
        outbox_relayer::http::router(metrics.clone(), health.clone()),
        served.clone(),
    )
    .await
    .unwrap();
    let metrics_text = || get(addr, "/metrics");
    let readyz = || get(addr, "/readyz");
    assert_eq!(status(&readyz().await), "200");
    assert!(metrics_text().await.contains("outbox_ready 1"));

    let locker = lock_holds(&db).await;
    write(&db, "blocked", 20).await;
    wait_until(
        "readiness to name the blocked claims",
        Duration::from_secs(30),
        || async { health.readiness().is_err_and(|n| n.reason == "claim") },
    )
    .await;
    let message = health.readiness().unwrap_err().message;
    assert!(message.starts_with("20 events pending"), "{message}");
    let answer = readyz().await;
    assert_eq!(status(&answer), "503", "{answer}");
    assert!(answer.contains("not ready: 20 events pending"), "{answer}");
    let text = metrics_text().await;
    assert!(text.contains("outbox_ready 0"), "{text}");
    assert!(
        text.contains("outbox_unready{reason=\"claim\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("outbox_unready{reason=\"stalled\"} 0"),
        "{text}"
    );
    assert!(
        gauge(&metrics, "outbox_database_errors_total") >= 1.0,
        "each blocked claim ends at lock_timeout and is counted"
    );
    assert_eq!(db.count("published").await, 0);

    unlock(locker).await;
    common::drained(&db, Duration::from_secs(20)).await;
    wait_until(
        "readiness to come back",
        Duration::from_secs(10),
        || async { health.readiness().is_ok() },
    )
    .await;
    assert!(metrics_text().await.contains("outbox_ready 1"));
    served.cancel();
    relay.shutdown().await.unwrap();
}

#[tokio::test]
async fn leases_are_renewed_while_a_blocked_claim_holds_the_only_connection() {
    let db = TestDb::new(2).await;
    // One connection for claims, marks and statistics; the claim will hold it, blocked.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    let mut config = common::fast_config(&db, &unique("p"));
    let ttl = config.lease_ttl;
    config.lock_timeout = Duration::from_secs(60);
    config.statement_timeout = Duration::from_secs(60);
    config.stall_timeout = Duration::from_secs(60);
    let relay = Relay::builder(pool, Arc::new(Switch::default()), config)
        .build()
        .await
        .unwrap();
    let relay_id = relay.relay_id().to_owned();
    let relay = relay.spawn();
    let live_leases =
        || async {
            sqlx::query_scalar::<_, i64>(&db.tables.render(
                "SELECT count(*) FROM {schema}.leases WHERE owner = $1 AND expires_at > now()",
            ))
            .bind(&relay_id)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        };
    wait_until(
        "the relay to own both partitions",
        Duration::from_secs(10),
        || async { live_leases().await == 2 },
    )
    .await;
    let locker = lock_holds(&db).await;
    write(&db, "blocked", 5).await;
    // Blocked claims hold the relay's one connection for three lease lifetimes: the lease
    // statements, on their own connection, keep both leases live throughout.
    let until = tokio::time::Instant::now() + ttl * 3;
    while tokio::time::Instant::now() < until {
        assert_eq!(
            live_leases().await,
            2,
            "a lease lapsed while the claim was blocked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(db.count("published").await, 0, "the claim was blocked");
    unlock(locker).await;
    common::drained(&db, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_relay_whose_loop_is_stuck_gives_its_leases_up_and_takes_them_back_after() {
    let db = TestDb::new(2).await;
    let mut config = common::fast_config(&db, &unique("p"));
    // A claim may block for a minute: the loop does not turn meanwhile.
    config.lock_timeout = Duration::from_secs(60);
    config.statement_timeout = Duration::from_secs(60);
    config.stall_timeout = Duration::from_secs(2);
    let relay = Relay::builder(db.pool.clone(), Arc::new(Switch::default()), config)
        .build()
        .await
        .unwrap();
    let (relay_id, health) = (relay.relay_id().to_owned(), relay.health());
    let relay = relay.spawn();
    let owned =
        || async {
            sqlx::query_scalar::<_, i64>(&db.tables.render(
                "SELECT count(*) FROM {schema}.leases WHERE owner = $1 AND expires_at > now()",
            ))
            .bind(&relay_id)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        };
    let live = || async {
        sqlx::query_scalar::<_, i64>(
            &db.tables
                .render("SELECT count(*) FROM {schema}.relays WHERE relay_id = $1"),
        )
        .bind(&relay_id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    wait_until(
        "the relay to own both partitions",
        Duration::from_secs(10),
        || async { owned().await == 2 },
    )
    .await;
    let locker = lock_holds(&db).await;
    write(&db, "blocked", 3).await;
    // Stuck for stall_timeout: not ready ("loop"), every lease released, out of the live set,
    // so that any other relay takes the partitions over at once.
    wait_until(
        "the stuck relay to give its leases up",
        Duration::from_secs(20),
        || async { owned().await == 0 && live().await == 0 },
    )
    .await;
    assert_eq!(health.readiness().unwrap_err().reason, "loop");
    unlock(locker).await;
    // The claim returns, the loop turns: the relay takes part again and publishes.
    wait_until(
        "the relay to take its partitions back",
        Duration::from_secs(20),
        || async { owned().await == 2 },
    )
    .await;
    common::drained(&db, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
}
