use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;

use crate::Delivery;

/// The shared NATS server.
pub const NATS_URL: &str = "nats://127.0.0.1:4222";

/// A JetStream stream of the test's own, read from the start by a background consumer.
pub struct NatsReader {
    js: jetstream::Context,
    /// Stream name.
    pub stream: String,
    /// Subject prefix captured by the stream (`{prefix}.>`).
    pub prefix: String,
    seen: Arc<Mutex<Vec<Delivery>>>,
    task: tokio::task::JoinHandle<()>,
}

impl NatsReader {
    /// Creates stream `{name}` capturing `{prefix}.>` on the server at `url` and starts reading.
    pub async fn start(url: &str, name: &str, prefix: &str) -> Self {
        Self::try_start(url, name, prefix)
            .await
            .expect("nats reader")
    }

    /// Like [`NatsReader::start`]; an error if the server (or JetStream) is unreachable.
    pub async fn try_start(url: &str, name: &str, prefix: &str) -> Result<Self, String> {
        let client = async_nats::connect(url)
            .await
            .map_err(|e| format!("connect to nats: {e}"))?;
        let js = jetstream::new(client);
        let stream = js
            .get_or_create_stream(stream::Config {
                name: name.to_owned(),
                subjects: vec![format!("{prefix}.>")],
                ..Default::default()
            })
            .await
            .map_err(|e| format!("create stream: {e}"))?;
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("create consumer: {e}"))?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            let mut messages = consumer.messages().await.expect("consume");
            while let Some(Ok(message)) = messages.next().await {
                let headers: BTreeMap<String, String> = message
                    .headers
                    .iter()
                    .flat_map(|h| h.iter())
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            v.first().map(|x| x.as_str().to_owned()).unwrap_or_default(),
                        )
                    })
                    .collect();
                sink.lock().unwrap().push(Delivery::from_headers(
                    message.subject.to_string(),
                    headers,
                    message.payload.to_vec(),
                ));
            }
        });
        Ok(Self {
            js,
            stream: name.to_owned(),
            prefix: prefix.to_owned(),
            seen,
            task,
        })
    }

    /// Everything delivered so far, in stream order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until at least `n` messages were read.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Delivery> {
        crate::wait_until(&format!("{n} messages on {}", self.stream), timeout, || {
            let len = self.seen.lock().unwrap().len();
            async move { len >= n }
        })
        .await;
        self.deliveries()
    }

    /// Stops reading and deletes the stream.
    pub async fn cleanup(self) {
        self.task.abort();
        let _ = self.js.delete_stream(&self.stream).await;
    }
}
