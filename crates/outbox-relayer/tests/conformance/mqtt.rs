//! MQTT 5: QoS 1 with the PUBACK as the ack, metadata as user properties; no broker dedupe.

use std::{process::Command, sync::Arc, time::Duration};

use outbox_relayer::{
    publishers::mqtt::{MqttConfig, MqttPublisher},
    Publisher,
};
use outbox_testkit::{unique, BrokerProcess, Delivery, MqttReader};

use crate::suite::{Harness, WAIT};

pub struct Mqtt {
    url: String,
    port: u16,
    prefix: String,
    reader: Option<MqttReader>,
}

impl Harness for Mqtt {
    const DEDUPES: bool = false;

    fn shared_url() -> String {
        "mqtt://127.0.0.1:1883".into()
    }

    fn private_url(port: u16) -> String {
        format!("mqtt://127.0.0.1:{port}")
    }

    fn private_server(broker: &BrokerProcess) -> Command {
        let mut command = Command::new("mosquitto");
        command.args(["-p", &broker.port.to_string()]);
        command
    }

    fn new(url: String) -> Self {
        let port = url
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("port in url");
        Self {
            url,
            port,
            prefix: unique("conf"),
            reader: None,
        }
    }

    /// Subscribes to `{prefix}/#` with QoS 1 and waits for the SUBACK.
    async fn prepare(&mut self) -> Result<(), String> {
        if self.reader.is_none() {
            let filter = format!("{}/#", self.prefix);
            self.reader = Some(MqttReader::try_start(self.port, &filter).await?);
        }
        Ok(())
    }

    fn destination(&self, i: usize) -> String {
        format!("{}/d{i}/OrderPlaced", self.prefix)
    }

    fn unroutable(&self) -> Option<String> {
        // Nobody subscribes to it: the broker answers "no matching subscribers".
        Some(format!("{}/nowhere", unique("conf")))
    }

    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(
            MqttPublisher::connect(MqttConfig {
                url: self.url.clone(),
                connect_timeout: Duration::from_secs(2),
                ack_timeout: Duration::from_secs(5),
                ..Default::default()
            })
            .expect("mqtt publisher"),
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

crate::conformance_tests!(Mqtt);
