use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use rumqttc::v5::{
    mqttbytes::{v5::Packet, QoS},
    AsyncClient, Event, MqttOptions,
};

use crate::Delivery;

/// A QoS 1 MQTT 5 subscription of the test's own, read in the background. MQTT keeps nothing
/// for absent subscribers: start it before anything is published.
pub struct MqttReader {
    client: AsyncClient,
    seen: Arc<Mutex<Vec<Delivery>>>,
    task: tokio::task::JoinHandle<()>,
}

impl MqttReader {
    /// Subscribes to `filter` on the broker at 127.0.0.1:`port` and waits for the SUBACK; an
    /// error if the broker is unreachable. User properties become headers, the content type
    /// `mqtt.content_type`.
    pub async fn try_start(port: u16, filter: &str) -> Result<Self, String> {
        let mut options = MqttOptions::new(crate::unique("reader"), "127.0.0.1", port);
        options
            .set_keep_alive(Duration::from_secs(30))
            .set_max_packet_size(Some(4 * 1024 * 1024));
        let (client, mut event_loop) = AsyncClient::new(options, 16);
        client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .map_err(|e| e.to_string())?;
        while !matches!(
            event_loop.poll().await.map_err(|e| e.to_string())?,
            Event::Incoming(Packet::SubAck(_))
        ) {}
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok(event) = event_loop.poll().await {
                let Event::Incoming(Packet::Publish(publish)) = event else {
                    continue;
                };
                let properties = publish.properties.as_ref();
                let mut headers: BTreeMap<String, String> = properties
                    .iter()
                    .flat_map(|p| p.user_properties.iter().cloned())
                    .collect();
                if let Some(ct) = properties.and_then(|p| p.content_type.clone()) {
                    headers.insert("mqtt.content_type".into(), ct);
                }
                sink.lock().unwrap().push(Delivery::from_headers(
                    String::from_utf8_lossy(&publish.topic).into_owned(),
                    headers,
                    publish.payload.to_vec(),
                ));
            }
        });
        Ok(Self { client, seen, task })
    }

    /// Everything received so far, in arrival order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until at least `n` messages arrived.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Delivery> {
        crate::wait_until(&format!("{n} MQTT messages"), timeout, || {
            let len = self.seen.lock().unwrap().len();
            async move { len >= n }
        })
        .await;
        self.deliveries()
    }

    /// Disconnects and stops reading.
    pub async fn cleanup(self) {
        let _ = self.client.disconnect().await;
        self.task.abort();
    }
}
