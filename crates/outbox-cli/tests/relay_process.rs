//! The `outbox relay` process: SIGKILL mid-batch, several processes, graceful shutdown,
//! metrics and readiness endpoints.

mod support;

use std::time::Duration;

use outbox_testkit::{
    free_port, insert_sequences, unique, wait_until, NatsReader, RabbitReader, Report, TestDb,
    NATS_URL, RABBITMQ_URL,
};
use support::{fast_config, http_get, RelayProcess};

const WAIT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn a_relay_killed_mid_batch_and_restarted_loses_nothing() {
    let db = TestDb::new(8).await;
    let prefix = unique("p");
    let exchange = unique("x");
    // RabbitMQ has no broker-side dedupe: every duplicate the crash causes is visible here.
    let reader = RabbitReader::start(&exchange, "#").await;
    let written = insert_sequences(&db, "order", 200, 50, 500).await;
    let config = fast_config(&prefix, &format!("[rabbitmq]\nexchange = \"{exchange}\""));

    let mut relay = RelayProcess::start(&db, RABBITMQ_URL, &config, "127.0.0.1:0");
    wait_until("the relay to be mid-way", WAIT, || async {
        db.count("published").await >= 2_000
    })
    .await;
    relay.kill();
    let at_kill = db.count("published").await;
    assert!((at_kill as usize) < written, "killed before the end");
    let mut restarted = RelayProcess::start(&db, RABBITMQ_URL, &config, "127.0.0.1:0");
    wait_until("every event to be delivered", WAIT, || {
        let report = Report::of(&reader.deliveries());
        async move { report.unique >= written }
    })
    .await;
    wait_until("the outbox to drain", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
    assert!(
        restarted.terminate(),
        "clean exit on SIGTERM:\n{}",
        restarted.log()
    );

    let report = Report::of(&reader.deliveries());
    println!("kill -9 mid-batch: {written} written, killed at {at_kill} marked, {report:?}");
    assert_eq!(report.unique, written, "nothing lost");
    assert_eq!(report.order_violations, 0);
    assert_eq!(db.count("published").await as usize, written);
    reader.cleanup().await;
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn three_relay_processes_keep_order_while_one_is_killed_and_restarted() {
    let db = TestDb::new(16).await;
    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let config = fast_config(&prefix, &format!("[nats]\nstream = \"{stream}\""));
    // The relay that is killed and restarted runs on a runtime of three threads; the others
    // on the default one.
    let start = |threads: &str| {
        let env = [("OUTBOX_WORKER_THREADS", threads)];
        RelayProcess::start_with_env(&db, NATS_URL, &config, "127.0.0.1:0", &env)
    };
    let mut relays = vec![start("1"), start("3"), start("1")];

    let writer = {
        let db = TestDb::adopt(db.pool.clone(), db.tables.clone());
        tokio::spawn(async move { insert_sequences(&db, "account", 300, 20, 150).await })
    };
    reader.wait_for(1_500, WAIT).await;
    relays[1].kill();
    reader.wait_for(3_000, WAIT).await;
    relays[1] = start("3");
    let written = writer.await.unwrap();
    let deliveries = reader.wait_for(written, WAIT).await;
    wait_until("the outbox to drain", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
    for relay in &mut relays {
        assert!(relay.terminate(), "clean exit:\n{}", relay.log());
    }
    let owned: i64 = sqlx::query_scalar(
        &db.tables
            .render("SELECT count(*) FROM {schema}.leases WHERE owner IS NOT NULL"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let report = Report::of(&deliveries);
    println!("three processes, one killed: {written} written, {report:?}");
    assert_eq!(report.unique, written);
    assert_eq!(report.order_violations, 0);
    assert_eq!(owned, 0, "clean shutdown releases every lease");
    reader.cleanup().await;
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn serves_metrics_health_and_readiness_on_localhost() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let config = fast_config(&prefix, &format!("[nats]\nstream = \"{stream}\""));
    let addr = format!("127.0.0.1:{}", free_port());
    let mut relay = RelayProcess::start(&db, NATS_URL, &config, &addr);
    let written = insert_sequences(&db, "order", 5, 4, 20).await;
    reader.wait_for(written, WAIT).await;
    wait_until("metrics to show the published events", WAIT, || async {
        match http_get(&addr, "/metrics").await {
            Some((200, body)) => body.contains(&format!(
                "outbox_published_total{{destination=\"{prefix}.order.Happened\"}} {written}"
            )),
            _ => false,
        }
    })
    .await;
    let (status, body) = http_get(&addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    for name in [
        "outbox_oldest_pending_age_seconds",
        "outbox_pending_events",
        "outbox_dead_events",
        "outbox_delivery_latency_seconds_bucket",
        "outbox_batch_size_bucket",
        "outbox_partitions_owned 4",
    ] {
        assert!(body.contains(name), "missing {name}");
    }
    assert_eq!(http_get(&addr, "/healthz").await.unwrap().0, 200);
    assert_eq!(http_get(&addr, "/readyz").await.unwrap().0, 200);
    assert!(relay.terminate());
    assert!(
        http_get(&addr, "/healthz").await.is_none(),
        "listener closed"
    );
    reader.cleanup().await;
    let _ = std::fs::remove_file(config);
}
