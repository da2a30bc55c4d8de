//! The relay's own periodic purge.

mod common;

use std::time::Duration;

use outbox_relayer::{Relay, RelayConfig};
use outbox_testkit::{insert_sequences, unique, wait_until, NatsReader, TestDb, NATS_URL};

#[tokio::test]
async fn the_relay_purges_published_rows_after_the_retention_and_nothing_else() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let written = insert_sequences(&db, "order", 10, 10, 50).await;
    db.exec("UPDATE {schema}.{events} SET status = 'dead' WHERE aggregate_id = 'a9'")
        .await;
    let relay = Relay::builder(
        db.pool.clone(),
        common::nats(NATS_URL, &reader.stream).await,
        RelayConfig {
            purge_retention: Some(Duration::from_millis(1)),
            purge_interval: Duration::from_millis(200),
            ..common::fast_config(&db, &prefix)
        },
    )
    .build()
    .await
    .unwrap();
    let metrics = relay.metrics();
    let relay = relay.spawn();
    reader.wait_for(written - 10, Duration::from_secs(60)).await;
    wait_until(
        "published rows to be purged",
        Duration::from_secs(60),
        || async { db.count("published").await == 0 && db.count("pending").await == 0 },
    )
    .await;
    relay.shutdown().await.unwrap();
    assert_eq!(db.count("dead").await, 10, "dead rows are kept");
    assert!(metrics
        .encode()
        .contains(&format!("outbox_purged_total {}", written - 10)));
    reader.cleanup().await;
}
