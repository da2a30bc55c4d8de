//! The relay against real PostgreSQL and RabbitMQ.

mod common;

use std::time::Duration;

use outbox_testkit::{insert_sequences, unique, wait_until, RabbitReader, Report, TestDb};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn publishes_persistent_confirmed_messages_in_order_with_their_metadata() {
    let db = TestDb::new(8).await;
    let prefix = unique("p");
    let exchange = unique("x");
    let reader = RabbitReader::start(&exchange, "#").await;
    let written = insert_sequences(&db, "order", 50, 10, 25).await;
    let relay = common::start(
        &db,
        common::rabbitmq(&exchange).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    let deliveries = reader.wait_for(written, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();

    let report = Report::of(&deliveries);
    assert_eq!(report.unique, written);
    assert_eq!(report.order_violations, 0);
    let first = &deliveries[0];
    assert_eq!(first.headers["amqp.message_id"], first.event_id);
    assert_eq!(first.headers["amqp.delivery_mode"], "2", "persistent");
    assert_eq!(first.headers["event-type"], "Happened");
    assert_eq!(first.destination, format!("{prefix}.order.Happened"));
    let body: serde_json::Value = serde_json::from_slice(&first.payload).unwrap();
    assert!(body.get("v").is_some());
    reader.cleanup().await;
}

#[tokio::test]
async fn unroutable_events_are_dead_lettered_and_park_only_their_aggregate() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let exchange = unique("x");
    // Only `ok` events have a queue; `lost` events are returned by the broker.
    let reader = RabbitReader::start(&exchange, &format!("{prefix}.ok.#")).await;
    let ok = insert_sequences(&db, "ok", 5, 4, 10).await;
    insert_sequences(&db, "lost", 1, 3, 10).await;
    let relay = common::start(
        &db,
        common::rabbitmq(&exchange).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    reader.wait_for(ok, WAIT).await;
    wait_until("the unroutable head to be dead", WAIT, || async {
        db.count("dead").await == 1
    })
    .await;
    relay.shutdown().await.unwrap();

    let error: String = sqlx::query_scalar(
        &db.tables
            .render("SELECT last_error FROM {schema}.{events} WHERE status = 'dead'"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        error.starts_with("permanent: rabbitmq: unroutable"),
        "{error}"
    );
    // The lost aggregate's later versions are parked behind its dead head.
    assert_eq!(db.count("pending").await, 2);
    let held: i64 = sqlx::query_scalar(&db.tables.render(
        "SELECT count(*) FROM {schema}.holds WHERE held_until IS NULL AND aggregate_type = 'lost'",
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(held, 1);
    assert_eq!(reader.deliveries().len(), ok);
    reader.cleanup().await;
}
