//! Helpers for the integration tests. Every test gets its own PostgreSQL schema, NATS stream
//! and subjects, RabbitMQ exchange and queue, Redis streams or MQTT topics, so tests run in
//! parallel against the shared servers; servers a test must stop are private processes on
//! their own ports.

mod db;
mod delivery;
mod mariadb;
mod mqtt;
mod mysql;
mod nats;
mod postgres;
mod process;
mod rabbitmq;
mod redis_streams;
mod sqlite;

use std::{future::Future, time::Duration};

pub use db::{cdc_database_url, database_url, insert_sequences, TestDb};
pub use delivery::{Delivery, Report};
pub use mariadb::PrivateMariaDb;
pub use mqtt::MqttReader;
pub use mysql::{mysql_url, MySqlDb};
pub use nats::{NatsReader, NATS_URL};
pub use postgres::{PrivatePostgres, ServerTls};
pub use process::{free_port, BrokerProcess, NatsServer};
pub use rabbitmq::{RabbitReader, RABBITMQ_URL};
pub use redis_streams::{stream_deliveries, REDIS_URL};
pub use sqlite::SqliteFile;

/// A name no other test (or earlier run) uses: `{prefix}_{12 hex digits}`, lowercase.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// Polls `condition` every 50 ms until it holds; panics with `what` after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if condition().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
