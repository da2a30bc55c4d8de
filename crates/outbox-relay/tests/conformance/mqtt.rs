//! MQTT 5: QoS 1 with the PUBACK as the ack, metadata as user properties; no broker dedupe.

use std::{
    collections::BTreeMap,
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};

use outbox_relay::{
    publishers::mqtt::{MqttConfig, MqttPublisher},
    Publisher,
};
use outbox_testkit::{unique, wait_until, BrokerProcess, Delivery};
use rumqttc::v5::{
    mqttbytes::{v5::Packet, QoS},
    AsyncClient, Event, MqttOptions,
};

use crate::suite::{Harness, WAIT};

pub struct Mqtt {
    url: String,
    port: u16,
    prefix: String,
    seen: Arc<Mutex<Vec<Delivery>>>,
    subscriber: Option<(AsyncClient, tokio::task::JoinHandle<()>)>,
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
            seen: Arc::new(Mutex::new(Vec::new())),
            subscriber: None,
        }
    }

    /// Subscribes to `{prefix}/#` with QoS 1 and waits for the SUBACK.
    async fn prepare(&mut self) -> Result<(), String> {
        if self.subscriber.is_some() {
            return Ok(());
        }
        let mut options = MqttOptions::new(unique("reader"), "127.0.0.1", self.port);
        options
            .set_keep_alive(Duration::from_secs(30))
            .set_max_packet_size(Some(4 * 1024 * 1024));
        let (client, mut event_loop) = AsyncClient::new(options, 16);
        client
            .subscribe(format!("{}/#", self.prefix), QoS::AtLeastOnce)
            .await
            .map_err(|e| e.to_string())?;
        loop {
            match event_loop.poll().await.map_err(|e| e.to_string())? {
                Event::Incoming(Packet::SubAck(_)) => break,
                _ => continue,
            }
        }
        let sink = self.seen.clone();
        let task = tokio::spawn(async move {
            while let Ok(event) = event_loop.poll().await {
                if let Event::Incoming(Packet::Publish(publish)) = event {
                    let mut headers: BTreeMap<String, String> = publish
                        .properties
                        .iter()
                        .flat_map(|p| p.user_properties.iter().cloned())
                        .collect();
                    if let Some(ct) = publish
                        .properties
                        .as_ref()
                        .and_then(|p| p.content_type.clone())
                    {
                        headers.insert("mqtt.content_type".into(), ct);
                    }
                    sink.lock().unwrap().push(Delivery::from_headers(
                        String::from_utf8_lossy(&publish.topic).into_owned(),
                        headers,
                        publish.payload.to_vec(),
                    ));
                }
            }
        });
        self.subscriber = Some((client, task));
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
        wait_until(&format!("{n} MQTT messages"), WAIT, || {
            let len = self.seen.lock().unwrap().len();
            async move { len >= n }
        })
        .await;
        self.seen.lock().unwrap().clone()
    }

    async fn cleanup(self) {
        if let Some((client, task)) = self.subscriber {
            let _ = client.disconnect().await;
            task.abort();
        }
    }
}

crate::conformance_tests!(Mqtt);
