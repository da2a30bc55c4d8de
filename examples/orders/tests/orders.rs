//! The orders flow end to end on PostgreSQL with each broker, a relay crash included.

use outbox_example_orders::{run, Scenario};
use outbox_testkit::{database_url, NATS_URL, RABBITMQ_URL};

async fn scenario(broker_url: &str) {
    let summary = run(&Scenario {
        database_url: database_url(),
        broker_url: broker_url.into(),
        orders: 150,
        crash: true,
    })
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
}

#[tokio::test]
async fn every_order_reserved_and_notified_once_through_nats() {
    scenario(NATS_URL).await;
}

#[tokio::test]
async fn every_order_reserved_and_notified_once_through_rabbitmq() {
    scenario(RABBITMQ_URL).await;
}
