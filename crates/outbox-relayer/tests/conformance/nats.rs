//! NATS JetStream: PubAck as the ack, `Nats-Msg-Id` = event id (dedupe window), headers.

use std::{process::Command, sync::Arc, time::Duration};

use outbox_relayer::{
    publishers::nats::{NatsConfig, NatsPublisher},
    Publisher,
};
use outbox_testkit::{unique, BrokerProcess, Delivery, NatsReader, NATS_URL};

use crate::suite::{Harness, WAIT};

pub struct Nats {
    url: String,
    stream: String,
    prefix: String,
    reader: Option<NatsReader>,
}

impl Harness for Nats {
    const DEDUPES: bool = true;

    fn shared_url() -> String {
        NATS_URL.into()
    }

    fn private_url(port: u16) -> String {
        format!("nats://127.0.0.1:{port}")
    }

    fn private_server(broker: &BrokerProcess) -> Command {
        let mut command = Command::new("nats-server");
        command
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &broker.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&broker.dir);
        command
    }

    fn new(url: String) -> Self {
        Self {
            url,
            stream: unique("CONF"),
            prefix: unique("conf"),
            reader: None,
        }
    }

    async fn prepare(&mut self) -> Result<(), String> {
        if self.reader.is_none() {
            self.reader = Some(NatsReader::try_start(&self.url, &self.stream, &self.prefix).await?);
        }
        Ok(())
    }

    fn destination(&self, i: usize) -> String {
        format!("{}.d{i}.OrderPlaced", self.prefix)
    }

    fn unroutable(&self) -> Option<String> {
        // No stream captures this subject, and the publisher may not create one.
        Some(format!("{}.nowhere", unique("conf")))
    }

    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(
            NatsPublisher::connect(NatsConfig {
                url: self.url.clone(),
                stream: self.stream.clone(),
                create_stream: false,
                ack_timeout: Duration::from_secs(2),
                ..Default::default()
            })
            .await
            .expect("nats publisher"),
        )
    }

    async fn read(&self, n: usize) -> Vec<Delivery> {
        let reader = self.reader.as_ref().expect("prepared");
        reader.wait_for(n, WAIT).await
    }

    async fn cleanup(self) {
        if let Some(reader) = self.reader {
            reader.cleanup().await;
        }
    }
}

crate::conformance_tests!(Nats);
