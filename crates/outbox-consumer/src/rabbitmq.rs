//! RabbitMQ runner: manual acks within a prefetch window. Every delivery is acknowledged once
//! it is applied, skipped as a duplicate, held in the consumer's database (its turn has not
//! come, or its first attempt failed: see [`crate::runner`]) or dead-lettered: published to the
//! dead-letter queue `{queue}.dead` with its error, confirmed, and only then acknowledged. No
//! delivery is requeued to wait, so a quorum queue's delivery limit counts only deliveries
//! that ended with the consumer gone (a crash, a stop). While the database is unreachable the
//! delivery in hand is kept and retried until the database answers: an outage spends no
//! attempt.

use std::{collections::BTreeMap, fmt, str::FromStr};

use futures::{future::BoxFuture, StreamExt as _};
use lapin::{
    message::Delivery as LapinDelivery,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions,
        BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable, LongString, ShortString},
    BasicProperties, Channel, Connection, ConnectionProperties,
};
use tokio_util::sync::CancellationToken;

use crate::{
    runner::{self, Delivery, Worker},
    ConsumerConfig, DeadLetters, Error, Message, Processor,
};

/// The type of a queue the runner declares (its dead-letter queue): explicit, so that a
/// virtual host's default queue type does not choose it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QueueType {
    /// A classic queue (the default): no delivery limit, so listing its dead letters (which
    /// returns them to the queue) never drops one.
    #[default]
    Classic,
    /// A quorum queue (replicated), declared with a delivery limit no listing of its dead
    /// letters reaches (`x-delivery-limit` 2,147,483,647), so that listing never drops one.
    Quorum,
}

impl QueueType {
    fn arguments(self) -> FieldTable {
        let mut arguments = FieldTable::default();
        let text = |s: &str| AMQPValue::LongString(LongString::from(s));
        match self {
            Self::Classic => arguments.insert("x-queue-type".into(), text("classic")),
            Self::Quorum => arguments.insert("x-queue-type".into(), text("quorum")),
        }
        arguments
    }
}

impl FromStr for QueueType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "classic" => Ok(Self::Classic),
            "quorum" => Ok(Self::Quorum),
            other => Err(format!("{other:?} is not a queue type (classic, quorum)")),
        }
    }
}

impl fmt::Display for QueueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Classic => "classic",
            Self::Quorum => "quorum",
        })
    }
}

/// Where to consume from.
#[derive(Clone, Debug)]
pub struct RabbitMqSource {
    /// Broker URL.
    pub url: String,
    /// Queue to consume (bound to the relay's exchange by the application).
    pub queue: String,
    /// Unacknowledged deliveries at once (default 16): the messages in hand.
    pub prefetch: u16,
    /// The type of the dead-letter queue `{queue}.dead` (default classic).
    pub dead_letter_queue_type: QueueType,
}

impl RabbitMqSource {
    /// Consume `queue` on `url` with the default prefetch.
    pub fn new(url: impl Into<String>, queue: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            queue: queue.into(),
            prefetch: 16,
            dead_letter_queue_type: QueueType::default(),
        }
    }
}

/// A running RabbitMQ consumer.
pub struct RabbitMqConsumer {
    _connection: Connection,
    consumer: lapin::Consumer,
    worker: Worker<RabbitMqDeadLetters>,
}

/// The dead-letter queue of a consumer, on its confirming channel.
pub(crate) struct RabbitMqDeadLetters {
    channel: Channel,
    queue: String,
    consumer: String,
}

impl RabbitMqConsumer {
    /// Connects, declares the dead-letter queue and starts consuming `source.queue`.
    pub async fn connect(
        source: RabbitMqSource,
        config: ConsumerConfig,
        processor: Processor,
    ) -> Result<Self, Error> {
        config.validate()?;
        let broker = |e: lapin::Error| Error::broker("rabbitmq", e);
        let connection = Connection::connect(&source.url, ConnectionProperties::default())
            .await
            .map_err(broker)?;
        let channel = connection.create_channel().await.map_err(broker)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(broker)?;
        let prefetch = source
            .prefetch
            .max(1)
            .min(u16::try_from(config.max_in_hand).unwrap_or(u16::MAX));
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(broker)?;
        let dead_queue = format!("{}.dead", source.queue);
        declare_dead_queue(&connection, &dead_queue, source.dead_letter_queue_type).await?;
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
                dead: RabbitMqDeadLetters {
                    channel,
                    queue: dead_queue,
                    consumer: config.name.clone(),
                },
                config,
                processor,
                system: "rabbitmq",
                // No ack deadline to extend (only the broker's `consumer_timeout`, 30 min by
                // default).
                outage_wait: std::time::Duration::from_secs(5),
            },
        })
    }

    /// The dead-letter queue.
    pub fn dead_letter_queue(&self) -> &str {
        &self.worker.dead.queue
    }

    /// Processes deliveries until `shutdown`: up to `config.concurrency` aggregates at once
    /// (within the prefetch window), each aggregate's one after another in the order
    /// received, while the sweeper applies held events as they come due. The deliveries in
    /// hand are finished first.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        // The connection stays open until the deliveries in hand are finished.
        let Self {
            _connection,
            consumer,
            worker,
        } = self;
        runner::run(
            consumer.map(|d| d.map(RabbitDelivery::new)),
            &worker,
            &shutdown,
            |e| Some(Error::broker("rabbitmq", e)),
            || Error::broker_message("rabbitmq: consumer cancelled"),
        )
        .await
    }
}

/// Declares the dead-letter queue, durable, of type `kind`. A queue declared before with
/// other arguments is reported with what to do (RabbitMQ refuses a redeclaration that
/// differs, and closes the channel: each declaration has one of its own).
///
/// A quorum queue is declared with a delivery limit no listing reaches (`i32::MAX`): listing
/// dead letters returns them to the queue, which counts a delivery, and a queue with a limit
/// drops a letter past it (RabbitMQ 4.0 and later set 20 when none is given). The unlimited
/// value -1 means "unlimited" only from 4.0 on: a 3.x broker takes it, and drops a letter at its
/// first return. A queue declared before with -1 (on 4.0, where it is right) or with none (on
/// 3.x, where that is unlimited) is taken as it is.
async fn declare_dead_queue(
    connection: &Connection,
    queue: &str,
    kind: QueueType,
) -> Result<(), Error> {
    let limits: &[Option<i32>] = match kind {
        QueueType::Classic => &[None],
        QueueType::Quorum => &[Some(i32::MAX), Some(-1), None],
    };
    let mut declared = declare_queue(connection, queue, kind, limits[0]).await?;
    let mut taken = limits[0];
    for limit in &limits[1..] {
        if declared.is_ok() {
            break;
        }
        declared = declare_queue(connection, queue, kind, *limit).await?;
        taken = *limit;
    }
    if declared.is_ok() && taken == Some(-1) {
        tracing::warn!(
            queue,
            "the dead-letter queue has x-delivery-limit -1: a RabbitMQ before 4.0 drops each \
             letter listed or left by a partial replay (see docs/consumers.md to repair it)"
        );
    }
    let limit = match kind {
        QueueType::Classic => "",
        QueueType::Quorum => ", with no delivery limit or one of 2147483647",
    };
    declared.map_err(|e| {
        Error::broker(
            format!(
                "rabbitmq: cannot declare the dead-letter queue {queue} as a durable {kind} \
                 queue{limit} (delete it, or set dead_letter_queue_type to the type it has)"
            ),
            e,
        )
    })
}

/// Declares `queue`, durable, of type `kind` with delivery limit `limit`, on a channel of its
/// own; the inner error is the broker's refusal.
async fn declare_queue(
    connection: &Connection,
    queue: &str,
    kind: QueueType,
    limit: Option<i32>,
) -> Result<Result<(), lapin::Error>, Error> {
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| Error::broker("rabbitmq", e))?;
    let mut arguments = kind.arguments();
    if let Some(limit) = limit {
        arguments.insert("x-delivery-limit".into(), AMQPValue::LongInt(limit));
    }
    let declared = channel
        .queue_declare(
            queue,
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await;
    if declared.is_ok() {
        let _ = channel.close(200, "declared").await;
    }
    Ok(declared.map(drop))
}

/// A RabbitMQ delivery, with its text form.
struct RabbitDelivery {
    delivery: LapinDelivery,
    raw: Message,
}

impl RabbitDelivery {
    fn new(delivery: LapinDelivery) -> Self {
        let raw = Message::new(
            delivery.routing_key.to_string(),
            headers_of(&delivery),
            delivery.data.clone(),
        );
        Self { delivery, raw }
    }
}

impl Delivery for RabbitDelivery {
    fn message(&self) -> &Message {
        &self.raw
    }

    fn redelivered(&self) -> bool {
        self.delivery.redelivered
    }

    async fn ack(self) {
        if let Err(e) = self.delivery.ack(BasicAckOptions::default()).await {
            tracing::warn!(error = %e, "ack failed; the message will be redelivered");
        }
    }

    async fn release(self) {
        let _ = self
            .delivery
            .nack(BasicNackOptions {
                requeue: true,
                ..Default::default()
            })
            .await;
    }

    async fn keep(&self) {}
}

impl DeadLetters for RabbitMqDeadLetters {
    /// Publishes to the dead-letter queue (default exchange) and waits for the confirm.
    fn dead_letter<'a>(
        &'a self,
        message: &'a Message,
        reason: &'a str,
        attempts: u32,
        origin: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let text = |s: &str| AMQPValue::LongString(LongString::from(s.to_owned()));
            let mut table = FieldTable::default();
            for (name, value) in &message.headers {
                table.insert(name.as_str().into(), text(value));
            }
            table.insert(
                "dead-letter-reason".into(),
                text(&reason.replace(['\r', '\n'], " ")),
            );
            table.insert("dead-letter-attempts".into(), text(&attempts.to_string()));
            table.insert("dead-letter-routing-key".into(), text(&message.destination));
            table.insert("dead-letter-consumer".into(), text(&self.consumer));
            for (name, value) in origin {
                table.insert((*name).into(), text(value));
            }
            let mut properties = BasicProperties::default()
                .with_headers(table)
                .with_delivery_mode(2);
            if let Some(id) = message.headers.get(outbox::wire::header::EVENT_ID) {
                properties = properties.with_message_id(ShortString::from(id.clone()));
            }
            if let Some(content_type) = message.headers.get("content-type") {
                properties = properties.with_content_type(ShortString::from(content_type.clone()));
            }
            let confirm = self
                .channel
                .basic_publish(
                    "",
                    &self.queue,
                    BasicPublishOptions::default(),
                    &message.payload,
                    properties,
                )
                .await
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| e.to_string())?;
            if confirm.is_ack() {
                Ok(())
            } else {
                Err("the broker refused the dead letter (nack)".into())
            }
        })
    }
}

/// A header's value as text: strings as they are; integers, booleans and floats in decimal;
/// a timestamp (seconds since the epoch) in RFC 3339. AMQP producers, CloudEvents' AMQP
/// binding among them, send numeric attributes (`cloudEvents:aggregateversion`) as integers:
/// dropping them would lose the version the gate orders by. Tables, arrays, bytes, decimals
/// and void have no text form and are left out.
fn header_text(value: &AMQPValue) -> Option<String> {
    Some(match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.to_string(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        AMQPValue::Timestamp(seconds) => {
            chrono::DateTime::from_timestamp(i64::try_from(*seconds).ok()?, 0)?
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        }
        AMQPValue::DecimalValue(_)
        | AMQPValue::FieldArray(_)
        | AMQPValue::FieldTable(_)
        | AMQPValue::ByteArray(_)
        | AMQPValue::Void => return None,
    })
}

/// The message's headers, plus its `content-type` property (where AMQP carries a CloudEvent's
/// `datacontenttype`, and the structured mode's media type) unless a header has that name.
pub(crate) fn headers_of(delivery: &LapinDelivery) -> BTreeMap<String, String> {
    let mut headers: BTreeMap<String, String> = delivery
        .properties
        .headers()
        .as_ref()
        .map(|t| {
            t.inner()
                .iter()
                .filter_map(|(k, v)| Some((k.to_string(), header_text(v)?)))
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

#[cfg(test)]
mod tests {
    use lapin::types::{ByteArray, LongString};

    use super::*;

    #[test]
    fn numeric_headers_are_read_as_text() {
        assert_eq!(header_text(&AMQPValue::LongInt(2)).as_deref(), Some("2"));
        assert_eq!(
            header_text(&AMQPValue::LongLongInt(-9_000_000_000)).as_deref(),
            Some("-9000000000")
        );
        assert_eq!(
            header_text(&AMQPValue::ShortShortUInt(7)).as_deref(),
            Some("7")
        );
        assert_eq!(
            header_text(&AMQPValue::Boolean(true)).as_deref(),
            Some("true")
        );
        assert_eq!(
            header_text(&AMQPValue::LongString(LongString::from("o-1"))).as_deref(),
            Some("o-1")
        );
        assert_eq!(
            header_text(&AMQPValue::Timestamp(1_796_126_400)).as_deref(),
            Some("2026-12-01T12:00:00Z")
        );
        // No text form: left out, as before.
        assert_eq!(
            header_text(&AMQPValue::ByteArray(ByteArray::from(vec![1u8]))),
            None
        );
        assert_eq!(header_text(&AMQPValue::Void), None);
        assert_eq!(header_text(&AMQPValue::Timestamp(u64::MAX)), None);
    }
}
