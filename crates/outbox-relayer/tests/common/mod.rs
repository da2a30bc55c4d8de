//! Shared set-up of the relay integration tests.
#![allow(dead_code)]

pub mod cdc;

use std::{sync::Arc, time::Duration};

use outbox_relayer::{
    publishers::{
        nats::{NatsConfig, NatsPublisher},
        rabbitmq::{RabbitMqConfig, RabbitMqPublisher},
    },
    retry::RetryPolicy,
    routing::RoutingConfig,
    Publisher, Relay, RelayConfig, RelayHandle,
};
use outbox_testkit::TestDb;

/// Settings that make a test fast: short leases, quick retries, 3 attempts before dead.
pub fn fast_config(db: &TestDb, prefix: &str) -> RelayConfig {
    fast_config_for(&db.schema, prefix)
}

/// [`fast_config`] for the outbox in `schema`.
pub fn fast_config_for(schema: &str, prefix: &str) -> RelayConfig {
    RelayConfig {
        schema: schema.into(),
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        poll_interval: Duration::from_millis(200),
        stats_interval: Duration::from_millis(500),
        publish_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
            max_transient_backoff: Duration::from_millis(200),
            max_attempts: 3,
        },
        routing: RoutingConfig {
            default: format!("{prefix}.{{aggregate_type}}.{{event_type}}"),
            rules: vec![],
        },
        ..Default::default()
    }
}

/// A NATS publisher into `stream` on the server at `url`.
pub async fn nats(url: &str, stream: &str) -> Arc<dyn Publisher> {
    Arc::new(
        NatsPublisher::connect(NatsConfig {
            url: url.into(),
            stream: stream.into(),
            ack_timeout: Duration::from_secs(2),
            ..Default::default()
        })
        .await
        .expect("nats publisher"),
    )
}

/// A RabbitMQ publisher into `exchange` on the shared server.
pub async fn rabbitmq(exchange: &str) -> Arc<dyn Publisher> {
    Arc::new(
        RabbitMqPublisher::connect(RabbitMqConfig {
            url: outbox_testkit::RABBITMQ_URL.into(),
            exchange: exchange.into(),
            ..Default::default()
        })
        .await
        .expect("rabbitmq publisher"),
    )
}

/// Starts a relay in this process.
pub async fn start(db: &TestDb, publisher: Arc<dyn Publisher>, config: RelayConfig) -> RelayHandle {
    Relay::builder(db.pool.clone(), publisher, config)
        .build()
        .await
        .expect("relay")
        .spawn()
}

/// Waits until no event is pending.
pub async fn drained(db: &TestDb, timeout: Duration) {
    outbox_testkit::wait_until("the outbox to drain", timeout, || async {
        db.count("pending").await == 0
    })
    .await;
}
