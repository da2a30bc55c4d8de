use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use lapin::{
    options::{
        BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
        QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    },
    types::{AMQPValue, FieldTable},
    Channel, Connection, ConnectionProperties, ExchangeKind,
};

use crate::Delivery;

/// The shared RabbitMQ server.
pub const RABBITMQ_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A topic exchange and a queue of the test's own, bound with `binding`, read in the
/// background. Deleted by [`RabbitReader::cleanup`].
pub struct RabbitReader {
    channel: Channel,
    _connection: Connection,
    /// Exchange name.
    pub exchange: String,
    /// Queue name.
    pub queue: String,
    seen: Arc<Mutex<Vec<Delivery>>>,
}

impl RabbitReader {
    /// Declares exchange, queue and binding like [`RabbitReader::start`], without consuming:
    /// the messages stay in the queue for another reader.
    pub async fn declare_only(exchange: &str, binding: &str) -> Self {
        Self::open(RABBITMQ_URL, exchange, binding, false)
            .await
            .expect("rabbitmq reader")
    }

    /// Declares exchange `exchange` (durable topic) and a queue bound with `binding`.
    pub async fn start(exchange: &str, binding: &str) -> Self {
        Self::open(RABBITMQ_URL, exchange, binding, true)
            .await
            .expect("rabbitmq reader")
    }

    /// Like [`RabbitReader::declare_only`] on the server at `url`; an error if it is
    /// unreachable.
    pub async fn try_declare_only(
        url: &str,
        exchange: &str,
        binding: &str,
    ) -> Result<Self, String> {
        Self::open(url, exchange, binding, false).await
    }

    /// Like [`RabbitReader::start`] on the server at `url`; an error if it is unreachable.
    pub async fn try_start(url: &str, exchange: &str, binding: &str) -> Result<Self, String> {
        Self::open(url, exchange, binding, true).await
    }

    async fn open(url: &str, exchange: &str, binding: &str, consume: bool) -> Result<Self, String> {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .map_err(|e| format!("connect to rabbitmq: {e}"))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("channel: {e}"))?;
        channel
            .exchange_declare(
                exchange,
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("declare exchange: {e}"))?;
        let queue = format!("{exchange}.q");
        channel
            .queue_declare(
                &queue,
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("declare queue: {e}"))?;
        channel
            .queue_bind(
                &queue,
                exchange,
                binding,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("bind: {e}"))?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        if !consume {
            return Ok(Self {
                channel,
                _connection: connection,
                exchange: exchange.to_owned(),
                queue,
                seen,
            });
        }
        let mut consumer = channel
            .basic_consume(
                &queue,
                "testkit",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("consume: {e}"))?;
        let sink = seen.clone();
        tokio::spawn(async move {
            while let Some(Ok(delivery)) = consumer.next().await {
                let props = &delivery.properties;
                let mut headers: BTreeMap<String, String> = props
                    .headers()
                    .as_ref()
                    .map(|t| {
                        t.inner()
                            .iter()
                            .map(|(k, v)| (k.to_string(), text(v)))
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(id) = props.message_id() {
                    headers.insert("amqp.message_id".into(), id.to_string());
                }
                if let Some(mode) = props.delivery_mode() {
                    headers.insert("amqp.delivery_mode".into(), mode.to_string());
                }
                sink.lock().unwrap().push(Delivery::from_headers(
                    delivery.routing_key.to_string(),
                    headers,
                    delivery.data.clone(),
                ));
                let _ = delivery.ack(BasicAckOptions::default()).await;
            }
        });
        Ok(Self {
            channel,
            _connection: connection,
            exchange: exchange.to_owned(),
            queue,
            seen,
        })
    }

    /// Everything delivered so far, in queue order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until at least `n` messages were read.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Delivery> {
        crate::wait_until(&format!("{n} messages on {}", self.queue), timeout, || {
            let len = self.seen.lock().unwrap().len();
            async move { len >= n }
        })
        .await;
        self.deliveries()
    }

    /// Deletes the queue and the exchange.
    pub async fn cleanup(self) {
        let _ = self
            .channel
            .queue_delete(&self.queue, QueueDeleteOptions::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(&self.exchange, ExchangeDeleteOptions::default())
            .await;
    }
}

fn text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.to_string(),
        other => format!("{other:?}"),
    }
}
