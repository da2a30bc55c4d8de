//! A broker stopped and restarted mid-run loses nothing and dead-letters nothing. Runs its own
//! NATS server on a free port; the shared one is never touched.

mod common;

use std::time::Duration;

use outbox_relayer::Relay;
use outbox_testkit::{
    insert_sequences, unique, wait_until, NatsReader, NatsServer, Report, TestDb,
};

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn a_broker_restart_mid_run_loses_nothing_and_dead_letters_nothing() {
    let mut server = NatsServer::start().await;
    let db = TestDb::new(8).await;
    let prefix = unique("p");
    let stream = unique("S");
    let relay = Relay::builder(
        db.pool.clone(),
        common::nats(&server.url(), &stream).await,
        common::fast_config(&db, &prefix),
    )
    .build()
    .await
    .unwrap();
    let metrics = relay.metrics();
    let relay = relay.spawn();

    let first = insert_sequences(&db, "order", 50, 10, 50).await;
    wait_until("some events to be published", WAIT, || async {
        db.count("published").await > 0
    })
    .await;
    server.stop();
    // Written while the broker is down.
    let second = insert_sequences(&db, "invoice", 50, 10, 50).await;
    wait_until("the relay to see the outage", WAIT, || {
        let text = metrics.encode();
        async move { text.contains("class=\"transient\"") }
    })
    .await;
    server.restart().await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();

    let reader = NatsReader::start(&server.url(), &stream, &prefix).await;
    let deliveries = reader.wait_for(first + second, WAIT).await;
    let report = Report::of(&deliveries);
    println!("broker restart: {} written, {report:?}", first + second);
    assert_eq!(report.unique, first + second);
    assert_eq!(report.order_violations, 0);
    assert_eq!(db.count("dead").await, 0, "an outage never dead-letters");
    reader.cleanup().await;
}
