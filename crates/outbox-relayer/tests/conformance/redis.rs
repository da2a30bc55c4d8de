//! Redis Streams: one `XADD` per event, the payload and every header as fields, the event id
//! deduped by the publisher's script within its window.

use std::{process::Command, sync::Arc};

use outbox_relayer::{
    publishers::redis::{RedisConfig, RedisPublisher},
    Publisher,
};
use outbox_testkit::{stream_deliveries, unique, wait_until, BrokerProcess, Delivery, REDIS_URL};
use redis::AsyncCommands;

use crate::suite::{Harness, WAIT};

pub struct Redis {
    url: String,
    prefix: String,
    connection: Option<redis::aio::MultiplexedConnection>,
}

impl Redis {
    fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.connection.clone().expect("prepared")
    }

    async fn entries(&self) -> Vec<Delivery> {
        let mut connection = self.connection();
        let mut out = Vec::new();
        for i in 0..4 {
            out.extend(stream_deliveries(&mut connection, &self.destination(i)).await);
        }
        out
    }
}

impl Harness for Redis {
    const DEDUPES: bool = true;

    fn shared_url() -> String {
        REDIS_URL.into()
    }

    fn private_url(port: u16) -> String {
        format!("redis://127.0.0.1:{port}")
    }

    fn private_server(broker: &BrokerProcess) -> Command {
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &broker.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&broker.dir);
        command
    }

    fn new(url: String) -> Self {
        Self {
            url,
            prefix: unique("conf"),
            connection: None,
        }
    }

    async fn prepare(&mut self) -> Result<(), String> {
        let client = redis::Client::open(self.url.as_str()).map_err(|e| e.to_string())?;
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        // The unroutable destination: a key that exists and is not a stream.
        let _: () = connection
            .set(format!("{}:not-a-stream", self.prefix), "plain string")
            .await
            .map_err(|e| e.to_string())?;
        self.connection = Some(connection);
        Ok(())
    }

    fn destination(&self, i: usize) -> String {
        format!("{}:d{i}", self.prefix)
    }

    fn unroutable(&self) -> Option<String> {
        Some(format!("{}:not-a-stream", self.prefix))
    }

    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(
            RedisPublisher::connect(RedisConfig {
                url: self.url.clone(),
                ..Default::default()
            })
            .expect("redis publisher"),
        )
    }

    async fn read(&self, n: usize) -> Vec<Delivery> {
        wait_until(&format!("{n} stream entries"), WAIT, || async {
            self.entries().await.len() >= n
        })
        .await;
        self.entries().await
    }

    async fn cleanup(self) {
        let mut connection = self.connection();
        let keys: Vec<String> = connection
            .keys(format!("*{}*", self.prefix))
            .await
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = connection.del(keys).await;
        }
    }
}

crate::conformance_tests!(Redis);
