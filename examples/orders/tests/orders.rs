//! The orders flow end to end, a relay crash included: on PostgreSQL with each broker, and on
//! PostgreSQL and MariaDB through webhooks (SQLite's run is `outbox demo`'s test).

use outbox_example_orders::{run, Lines, Scenario, Summary};
use outbox_testkit::{database_url, mysql_url, NATS_URL, RABBITMQ_URL};

async fn scenario(database_url: String, broker_url: Option<&str>) -> Summary {
    let summary = run(
        &Scenario {
            database_url: Some(database_url),
            broker_url: broker_url.map(str::to_owned),
            drop_ack_every: 7,
            ..Scenario::new(150)
        },
        &Lines,
    )
    .await
    .unwrap();
    println!("{summary}");
    assert!(summary.crashed);
    assert_eq!(summary.orders, 150);
    assert_eq!(summary.published, 150);
    assert_eq!(summary.lost, 0);
    assert_eq!(summary.applied_twice, 0);
    assert_eq!(summary.reserved, summary.ordered);
    assert_eq!(summary.notifications, 150);
    assert!(summary.guarantees_hold(), "{summary}");
    summary
}

#[tokio::test]
async fn every_order_reserved_and_notified_once_through_nats() {
    scenario(database_url(), Some(NATS_URL)).await;
}

#[tokio::test]
async fn every_order_reserved_and_notified_once_through_rabbitmq() {
    scenario(database_url(), Some(RABBITMQ_URL)).await;
}

#[tokio::test]
async fn every_order_reserved_and_notified_once_on_postgres_through_webhooks() {
    let summary = scenario(database_url(), None).await;
    let deliveries = summary
        .deliveries
        .clone()
        .expect("webhooks count deliveries");
    assert!(deliveries.dropped_acks > 0, "{summary}");
    assert!(
        deliveries.duplicates >= deliveries.dropped_acks,
        "each lost acknowledgement is redelivered and discarded by the inbox: {summary}"
    );
}

#[tokio::test]
async fn every_order_reserved_and_notified_once_on_mariadb_through_webhooks() {
    let summary = scenario(mysql_url(), None).await;
    let deliveries = summary
        .deliveries
        .clone()
        .expect("webhooks count deliveries");
    assert!(
        deliveries.duplicates >= deliveries.dropped_acks && deliveries.dropped_acks > 0,
        "{summary}"
    );
}

#[tokio::test]
async fn a_broker_with_a_database_other_than_postgres_is_refused_naming_the_cause() {
    let error = run(
        &Scenario {
            database_url: Some(mysql_url()),
            broker_url: Some(NATS_URL.into()),
            ..Scenario::new(10)
        },
        &Lines,
    )
    .await
    .expect_err("the consumer runners keep their inbox on PostgreSQL");
    assert!(error.to_string().contains("postgres://"), "{error}");
}
