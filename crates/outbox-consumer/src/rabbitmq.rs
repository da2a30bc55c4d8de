//! RabbitMQ runner: manual acks with a prefetch window. A failed message is held (unacked)
//! for its backoff, then requeued, while later messages go on; after `max_attempts` failures,
//! or at once when malformed, it is published to the dead-letter queue `{queue}.dead` with its
//! error (confirmed), and only then acked. Attempts are counted per event id in memory: a
//! restarted consumer gives a poison message at most `max_attempts` more tries. While the
//! database is unreachable the message in hand is held and retried until the database answers
//! (consumption pauses meanwhile): an outage spends no attempt.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use lapin::{
    message::Delivery,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions,
        BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable, LongString, ShortString},
    BasicProperties, Channel, Connection, ConnectionProperties,
};
use tokio_util::sync::CancellationToken;

use crate::{
    lanes::{self, Lane},
    outage, ConsumerConfig, Count, Envelope, Error, Processor,
};

/// Where to consume from.
#[derive(Clone, Debug)]
pub struct RabbitMqSource {
    /// Broker URL.
    pub url: String,
    /// Queue to consume (bound to the relay's exchange by the application).
    pub queue: String,
    /// Unacked messages held at once (default 16): bounds the messages waiting in backoff.
    pub prefetch: u16,
}

impl RabbitMqSource {
    /// Consume `queue` on `url` with the default prefetch.
    pub fn new(url: impl Into<String>, queue: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            queue: queue.into(),
            prefetch: 16,
        }
    }
}

/// A running RabbitMQ consumer.
pub struct RabbitMqConsumer {
    _connection: Connection,
    consumer: lapin::Consumer,
    worker: Worker,
}

/// What handles one delivery: shared by the deliveries in flight.
struct Worker {
    channel: Channel,
    config: ConsumerConfig,
    processor: Processor,
    dead_queue: String,
    attempts: Arc<Mutex<HashMap<String, u32>>>,
}

impl RabbitMqConsumer {
    /// Connects, declares the dead-letter queue and starts consuming `source.queue`.
    pub async fn connect(
        source: RabbitMqSource,
        config: ConsumerConfig,
        processor: Processor,
    ) -> Result<Self, Error> {
        config.validate()?;
        let broker = |e: lapin::Error| Error::Broker(format!("rabbitmq: {e}"));
        let connection = Connection::connect(&source.url, ConnectionProperties::default())
            .await
            .map_err(broker)?;
        let channel = connection.create_channel().await.map_err(broker)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(broker)?;
        channel
            .basic_qos(source.prefetch.max(1), BasicQosOptions::default())
            .await
            .map_err(broker)?;
        let dead_queue = format!("{}.dead", source.queue);
        channel
            .queue_declare(
                &dead_queue,
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(broker)?;
        let consumer = channel
            .basic_consume(
                &source.queue,
                &config.name,
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(broker)?;
        Ok(Self {
            _connection: connection,
            consumer,
            worker: Worker {
                channel,
                config,
                processor,
                dead_queue,
                attempts: Arc::new(Mutex::new(HashMap::new())),
            },
        })
    }

    /// The dead-letter queue.
    pub fn dead_letter_queue(&self) -> &str {
        &self.worker.dead_queue
    }

    /// Processes deliveries until `shutdown`: up to `config.concurrency` aggregates at once
    /// (within the prefetch window), each aggregate's one after another in the order
    /// received. The deliveries in hand are finished first.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        // The connection stays open until the deliveries in hand are finished.
        let Self {
            _connection,
            consumer,
            worker,
        } = self;
        lanes::drive(
            consumer,
            worker.config.concurrency,
            &shutdown,
            lane_of,
            |e| Some(Error::Broker(format!("rabbitmq: {e}"))),
            || Error::Broker("rabbitmq: consumer cancelled".into()),
            |delivery| worker.handle(delivery, &shutdown),
        )
        .await
    }
}

impl Worker {
    async fn handle(&self, delivery: Delivery, shutdown: &CancellationToken) {
        let headers = headers_of(&delivery);
        let envelope = Envelope::decode(
            delivery.routing_key.to_string(),
            headers,
            delivery.data.clone().into(),
        )
        .map_err(|e| e.to_string())
        // An event that cannot reach its current version never will: dead-letter it at once.
        .and_then(|e| self.processor.upcast(e).map_err(|e| e.to_string()));
        let key = envelope
            .as_ref()
            .map(|e| e.event_id.to_string())
            .unwrap_or_default();
        // RabbitMQ has no ack deadline to extend (only the broker's `consumer_timeout`, 30 min
        // by default): the wait needs no keep-alive.
        let longest_wait = Duration::from_secs(5);
        let result = match &envelope {
            Err(e) => Err((e.to_string(), u32::MAX)),
            Ok(event) => outage::apply(
                "rabbitmq",
                &self.processor,
                event,
                shutdown,
                longest_wait,
                || async {},
            )
            .await
            .map_err(|e| {
                if !e.counts_as_attempt() {
                    // Shut down during an outage, or waiting for an earlier version of
                    // its aggregate: requeued after the first backoff, no attempt spent.
                    return (e.to_string(), 0);
                }
                let mut attempts = self.attempts.lock().expect("not poisoned");
                let n = attempts.entry(key.clone()).or_insert(0);
                *n += 1;
                (e.to_string(), *n)
            }),
        };
        match result {
            Ok(_) => {
                self.attempts.lock().expect("not poisoned").remove(&key);
                if let Err(e) = delivery.ack(BasicAckOptions::default()).await {
                    tracing::warn!(error = %e, "ack failed; the message will be redelivered");
                }
            }
            Err((error, attempts)) if attempts >= self.config.max_attempts => {
                tracing::error!(%error, attempts, consumer = self.processor.name(),
                    "dead-lettering message");
                if self.dead_letter(&delivery, &error, attempts).await {
                    self.attempts.lock().expect("not poisoned").remove(&key);
                    self.processor.count(Count::DeadLettered);
                    let _ = delivery.ack(BasicAckOptions::default()).await;
                } else {
                    let _ = delivery
                        .nack(BasicNackOptions {
                            requeue: true,
                            ..Default::default()
                        })
                        .await;
                }
            }
            Err((error, attempts)) => {
                let delay = self.config.backoff(attempts);
                tracing::warn!(%error, attempts, ?delay, "handler failed; will redeliver");
                // Hold the delivery (unacked) for the backoff, then requeue it; the loop goes
                // on with later messages meanwhile.
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = delivery
                        .nack(BasicNackOptions {
                            requeue: true,
                            ..Default::default()
                        })
                        .await;
                });
            }
        }
    }

    async fn dead_letter(&self, delivery: &Delivery, error: &str, attempts: u32) -> bool {
        let mut table = delivery.properties.headers().clone().unwrap_or_default();
        let text = |s: &str| AMQPValue::LongString(LongString::from(s.to_owned()));
        table.insert(
            "dead-letter-reason".into(),
            text(&error.replace(['\r', '\n'], " ")),
        );
        let attempts = if attempts == u32::MAX { 1 } else { attempts };
        table.insert("dead-letter-attempts".into(), text(&attempts.to_string()));
        table.insert(
            "dead-letter-routing-key".into(),
            text(delivery.routing_key.as_str()),
        );
        table.insert("dead-letter-consumer".into(), text(self.processor.name()));
        let properties = BasicProperties::default()
            .with_headers(table)
            .with_delivery_mode(2)
            .with_message_id(
                delivery
                    .properties
                    .message_id()
                    .clone()
                    .unwrap_or_else(|| ShortString::from("")),
            );
        let published = self
            .channel
            .basic_publish(
                "",
                &self.dead_queue,
                BasicPublishOptions::default(),
                &delivery.data,
                properties,
            )
            .await;
        match published {
            Ok(confirm) => matches!(confirm.await, Ok(c) if c.is_ack()),
            Err(e) => {
                tracing::warn!(error = %e, "dead-letter publish failed; will retry");
                false
            }
        }
    }
}

/// The delivery's aggregate (`aggregate-type`, `aggregate-id` headers); one without has a lane
/// of its own.
fn lane_of(delivery: &Delivery) -> Lane {
    let table = delivery.properties.headers().as_ref();
    let header = |name: &str| match table.and_then(|t| t.inner().get(name)) {
        Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        Some(AMQPValue::ShortString(s)) => Some(s.to_string()),
        _ => None,
    };
    match (header("aggregate-type"), header("aggregate-id")) {
        (Some(kind), Some(id)) => Lane::Aggregate(kind, id),
        _ => Lane::Alone(delivery.delivery_tag),
    }
}

/// The message's headers, plus its `content-type` property (where AMQP carries a CloudEvent's
/// `datacontenttype`, and the structured mode's media type) unless a header has that name.
pub(crate) fn headers_of(delivery: &Delivery) -> BTreeMap<String, String> {
    let mut headers: BTreeMap<String, String> = delivery
        .properties
        .headers()
        .as_ref()
        .map(|t| {
            t.inner()
                .iter()
                .filter_map(|(k, v)| match v {
                    AMQPValue::LongString(s) => Some((
                        k.to_string(),
                        String::from_utf8_lossy(s.as_bytes()).into_owned(),
                    )),
                    AMQPValue::ShortString(s) => Some((k.to_string(), s.to_string())),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if let Some(content_type) = delivery.properties.content_type() {
        headers
            .entry("content-type".into())
            .or_insert_with(|| content_type.to_string());
    }
    headers
}

/// Convenience: connect and run until `shutdown`.
pub async fn run(
    source: RabbitMqSource,
    config: ConsumerConfig,
    processor: Processor,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    RabbitMqConsumer::connect(source, config, processor)
        .await?
        .run(shutdown)
        .await
}
