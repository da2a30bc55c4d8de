//! Reading what a broker holds, in its order, without holding it all: each reader sends the
//! messages in batches to the audit and stops at about the end the broker had when it began
//! (NATS: the consumer's count of pending messages; RabbitMQ: the queue's depth; Kafka: the end
//! of each partition, or the first record stamped after the audit began).
//! NATS JetStream (a stream, read without consuming it), RabbitMQ (a dedicated audit queue,
//! consumed) and Kafka (topics, read from each partition's start without committing offsets).

use tokio::sync::mpsc::Sender;
#[cfg(any(feature = "nats", feature = "rabbitmq", feature = "kafka"))]
use uuid::Uuid;

use super::audit::Seen;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Messages per batch handed to the audit (one database lookup each).
pub const BATCH: usize = 1000;

/// How long a read waits for the next message before it gives up.
#[cfg(any(feature = "nats", feature = "kafka"))]
const STALL: std::time::Duration = std::time::Duration::from_secs(10);

/// Where to read, from `outbox verify`'s options.
pub struct Source {
    /// nats://…, amqp(s)://… or kafka://host:port[,…].
    pub url: String,
    /// NATS: the stream.
    pub stream: String,
    /// RabbitMQ: the audit queue.
    #[cfg_attr(not(feature = "rabbitmq"), allow(dead_code))]
    pub queue: Option<String>,
    /// Kafka: the topics.
    pub topics: Vec<String>,
    /// Kafka: librdkafka properties, KEY=VALUE.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub kafka_properties: Vec<String>,
    /// Read from this time on (NATS: by the stream's time; Kafka: by the record's): the
    /// window's start less the allowed clock skew.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// NATS, Kafka: the read ends at the first message stored after this time (the audit's
    /// start plus the allowed skew), if it did not reach the end before: what follows was
    /// published after the audit began, and a stream written without pause has no end.
    #[cfg_attr(not(any(feature = "nats", feature = "kafka")), allow(dead_code))]
    pub until_stamp: chrono::DateTime<chrono::Utc>,
}

/// A message as the audit needs it, from its headers (`None` for a header that is absent):
/// the outbox's own (`event-id`, `aggregate-type`, …), or a CloudEvent's, in binary mode
/// (`ce-id`, `ce_id`, `cloudEvents:id`, `subject`, `aggregatetype`, `aggregateversion`) or in
/// structured mode (the same attributes in a JSON body).
#[cfg(any(feature = "nats", feature = "rabbitmq", feature = "kafka"))]
fn seen(lane: i32, header: impl Fn(&str) -> Option<String>, payload: &[u8]) -> Seen {
    let copy = header("copy-of-schema-version").is_some();
    if let Some(id) = header("event-id") {
        let aggregate = match (header("aggregate-type"), header("aggregate-id")) {
            (Some(kind), Some(id)) => Some((kind, id)),
            _ => None,
        };
        return Seen {
            lane,
            event_id: Uuid::parse_str(&id).ok(),
            aggregate,
            version: header("aggregate-version").and_then(|v| v.parse().ok()),
            copy,
        };
    }
    for prefix in ["ce-", "ce_", "cloudEvents:"] {
        let attribute = |name: &str| header(&format!("{prefix}{name}"));
        if let Some(id) = attribute("id") {
            return cloudevent(lane, copy, Some(id), attribute);
        }
    }
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(payload) {
        Ok(body) if body.contains_key("specversion") => {
            let attribute = |name: &str| match body.get(name) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                _ => None,
            };
            cloudevent(lane, copy, attribute("id"), attribute)
        }
        _ => Seen {
            lane,
            event_id: None,
            aggregate: None,
            version: None,
            copy,
        },
    }
}

/// A CloudEvent's attributes as the audit needs them (the relay's: `subject` is the aggregate
/// id, `aggregatetype` and `aggregateversion` extensions).
#[cfg(any(feature = "nats", feature = "rabbitmq", feature = "kafka"))]
fn cloudevent(
    lane: i32,
    copy: bool,
    id: Option<String>,
    attribute: impl Fn(&str) -> Option<String>,
) -> Seen {
    let aggregate = match (attribute("aggregatetype"), attribute("subject")) {
        (Some(kind), Some(id)) => Some((kind, id)),
        _ => None,
    };
    Seen {
        lane,
        event_id: id.and_then(|id| Uuid::parse_str(&id).ok()),
        aggregate,
        version: attribute("aggregateversion").and_then(|v| v.parse().ok()),
        copy,
    }
}

/// Reads the broker `source` names into `out`, batch by batch.
pub async fn read(source: Source, out: Sender<Vec<Seen>>) -> Result<(), Error> {
    let url = source.url.as_str();
    if url.starts_with("nats://") || url.starts_with("tls://") {
        return nats(&source, out).await;
    }
    if url.starts_with("amqp://") || url.starts_with("amqps://") {
        return rabbitmq(&source, out).await;
    }
    if url.starts_with("kafka://") {
        if source.topics.is_empty() {
            return Err(
                "--topic is required with kafka:// (repeatable: every topic the relay \
                        routes to)"
                    .into(),
            );
        }
        return kafka(source, out).await;
    }
    Err("--broker-url must be nats://…, amqp://… or kafka://host:port[,host:port…]".into())
}

#[cfg(not(feature = "nats"))]
async fn nats(_: &Source, _: Sender<Vec<Seen>>) -> Result<(), Error> {
    Err("this build of outbox cannot read NATS: build it with the cargo feature `nats`".into())
}

#[cfg(not(feature = "rabbitmq"))]
async fn rabbitmq(_: &Source, _: Sender<Vec<Seen>>) -> Result<(), Error> {
    Err(
        "this build of outbox cannot read RabbitMQ: build it with the cargo feature `rabbitmq`"
            .into(),
    )
}

#[cfg(not(feature = "kafka"))]
async fn kafka(_: Source, _: Sender<Vec<Seen>>) -> Result<(), Error> {
    Err("this build of outbox cannot read Kafka: build it with the cargo feature `kafka`".into())
}

/// Sends a full batch on; false when the audit stopped listening.
async fn flush(batch: &mut Vec<Seen>, out: &Sender<Vec<Seen>>) -> bool {
    batch.is_empty() || out.send(std::mem::take(batch)).await.is_ok()
}

/// Reads the stream from `since` (or its start) up to the message the consumer found last when
/// it was created, through an ordered consumer: nothing is consumed.
#[cfg(feature = "nats")]
async fn nats(source: &Source, out: Sender<Vec<Seen>>) -> Result<(), Error> {
    use async_nats::jetstream::{self, consumer};
    use futures::StreamExt;
    let js = jetstream::new(async_nats::connect(&source.url).await?);
    let stream = js.get_stream(&source.stream).await?;
    let deliver_policy = match source.since {
        Some(t) => consumer::DeliverPolicy::ByStartTime {
            start_time: time::OffsetDateTime::from_unix_timestamp(t.timestamp())?,
        },
        None => consumer::DeliverPolicy::All,
    };
    let reader = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy,
            ..Default::default()
        })
        .await?;
    if reader.cached_info().num_pending == 0 {
        return Ok(());
    }
    let mut messages = reader.messages().await?;
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let Some(message) = tokio::time::timeout(STALL, messages.next())
            .await
            .map_err(|_| "timed out reading the stream")?
        else {
            break;
        };
        let message = message?;
        let headers = message.headers.as_ref();
        batch.push(seen(
            0,
            |name| {
                // A NATS header name holds no ':' (async-nats panics on one): AMQP's
                // `cloudEvents:` names are never NATS headers.
                if name.contains(':') {
                    return None;
                }
                headers
                    .and_then(|h| h.get(name))
                    .map(|v| v.as_str().to_owned())
            },
            &message.payload,
        ));
        // None left after this one, or this one stored after the audit began (a stream
        // written without pause has no end to reach), is the end of the read.
        let done = message.info().map_or(true, |i| {
            i.pending == 0 || i.published.unix_timestamp() > source.until_stamp.timestamp()
        });
        if done {
            break;
        }
        if batch.len() == BATCH && !flush(&mut batch, &out).await {
            return Ok(());
        }
    }
    flush(&mut batch, &out).await;
    Ok(())
}

/// Consumes the messages the audit queue held when the read began (those that arrive later
/// stay for the next audit).
#[cfg(feature = "rabbitmq")]
async fn rabbitmq(source: &Source, out: Sender<Vec<Seen>>) -> Result<(), Error> {
    use lapin::{
        options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions},
        types::{AMQPValue, FieldTable},
        Connection, ConnectionProperties,
    };
    let queue = source
        .queue
        .as_deref()
        .ok_or("--queue is required with amqp:// (a dedicated audit queue: verify consumes it)")?;
    let connection = Connection::connect(&source.url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let depth = channel
        .queue_declare(
            queue,
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("no audit queue {queue}: {e}"))?
        .message_count();
    let mut batch = Vec::with_capacity(BATCH);
    for _ in 0..depth {
        let Some(message) = channel.basic_get(queue, BasicGetOptions::default()).await? else {
            break;
        };
        let headers = message.delivery.properties.headers().as_ref();
        batch.push(seen(
            0,
            |name| match headers.and_then(|t| t.inner().get(name)) {
                Some(AMQPValue::LongString(s)) => {
                    std::str::from_utf8(s.as_bytes()).ok().map(str::to_owned)
                }
                Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_owned()),
                _ => None,
            },
            &message.delivery.data,
        ));
        message.delivery.ack(BasicAckOptions::default()).await?;
        if batch.len() == BATCH && !flush(&mut batch, &out).await {
            return Ok(());
        }
    }
    flush(&mut batch, &out).await;
    Ok(())
}

/// Reads every partition of the topics from its start (or `--since`) to its end, topic by
/// topic, in a group of its own that commits nothing. Each partition is a lane of its own:
/// Kafka orders messages per partition only. A partition's end is where the broker says it
/// is (librdkafka's end-of-partition event), not the high watermark read before: some
/// Kafka-protocol brokers report a watermark short of the log's end; or the first record
/// stamped after `until_stamp`, so that a partition written without pause ends too.
#[cfg(feature = "kafka")]
async fn kafka(source: Source, out: Sender<Vec<Seen>>) -> Result<(), Error> {
    use rdkafka::ClientConfig;
    let mut config = ClientConfig::new();
    for (key, value) in crate::commands::kafka_properties(&source.kafka_properties)? {
        config.set(key, value);
    }
    config
        .set(
            "bootstrap.servers",
            crate::commands::kafka_brokers(&source.url)?,
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true");
    tokio::task::spawn_blocking(move || {
        let mut lanes = 0;
        let mut read = std::collections::HashSet::new();
        for topic in &source.topics {
            // A topic named twice is read once.
            if read.insert(topic.as_str()) {
                kafka_topic(&source, &config, topic, &mut lanes, &out)?;
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| format!("kafka: the reader failed: {e}"))?
}

/// Reads one topic with a reader made from `config`, in a group of its own; its partitions
/// take lanes from `lanes` on.
#[cfg(feature = "kafka")]
fn kafka_topic(
    source: &Source,
    config: &rdkafka::ClientConfig,
    topic: &str,
    lanes: &mut i32,
    out: &Sender<Vec<Seen>>,
) -> Result<(), Error> {
    use std::collections::HashMap;

    use rdkafka::{
        consumer::{BaseConsumer, Consumer},
        error::KafkaError,
        message::{Headers, Message},
        Offset, TopicPartitionList,
    };
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", format!("outbox-verify-{}", Uuid::now_v7()))
        .create()
        .map_err(|e| match e {
            KafkaError::ClientConfig(_, description, key, _) => {
                format!("kafka: property {key:?}: {description}")
            }
            other => format!("kafka: cannot create a reader: {other}"),
        })?;
    let timeout = std::time::Duration::from_secs(10);
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| format!("kafka: reading topic {topic}: {e}"))?;
    let partitions: Vec<i32> = match metadata.topics().iter().find(|t| t.name() == topic) {
        Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
            t.partitions().iter().map(|p| p.id()).collect()
        }
        _ => return Err(format!("kafka: no topic {topic}").into()),
    };
    // partition → lane, for the partitions not at their end yet.
    let mut left: HashMap<i32, i32> = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for partition in partitions {
        let start = match source.since {
            Some(t) => offset_at(&consumer, topic, partition, t)?,
            None => Offset::Beginning,
        };
        assignment
            .add_partition_offset(topic, partition, start)
            .map_err(|e| format!("kafka: assigning {topic}/{partition}: {e}"))?;
        left.insert(partition, *lanes);
        *lanes += 1;
    }
    consumer
        .assign(&assignment)
        .map_err(|e| format!("kafka: assigning {topic}: {e}"))?;
    let mut batch = Vec::with_capacity(BATCH);
    let mut last_progress = std::time::Instant::now();
    while !left.is_empty() {
        if last_progress.elapsed() > STALL {
            return Err(format!("kafka: timed out before reaching the end of {topic}").into());
        }
        let Some(message) = consumer.poll(std::time::Duration::from_millis(200)) else {
            continue;
        };
        last_progress = std::time::Instant::now();
        let message = match message {
            Ok(message) => message,
            Err(KafkaError::PartitionEOF(partition)) => {
                left.remove(&partition);
                continue;
            }
            Err(e) => return Err(format!("kafka: reading {topic}: {e}").into()),
        };
        let Some(&lane) = left.get(&message.partition()) else {
            continue;
        };
        if message
            .timestamp()
            .to_millis()
            .is_some_and(|ms| ms > source.until_stamp.timestamp_millis())
        {
            left.remove(&message.partition());
            continue;
        }
        let headers = message.headers();
        batch.push(seen(
            lane,
            |name| {
                headers.and_then(|h| {
                    h.iter()
                        .filter(|header| header.key == name)
                        .last()
                        .and_then(|header| header.value)
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .map(str::to_owned)
                })
            },
            message.payload().unwrap_or_default(),
        ));
        if batch.len() == BATCH && out.blocking_send(std::mem::take(&mut batch)).is_err() {
            return Ok(());
        }
    }
    if !batch.is_empty() {
        let _ = out.blocking_send(batch);
    }
    Ok(())
}

/// Where a partition's messages from time `t` on begin (its end when there are none).
#[cfg(feature = "kafka")]
fn offset_at(
    consumer: &rdkafka::consumer::BaseConsumer,
    topic: &str,
    partition: i32,
    t: chrono::DateTime<chrono::Utc>,
) -> Result<rdkafka::Offset, Error> {
    use rdkafka::{consumer::Consumer, Offset, TopicPartitionList};
    let mut query = TopicPartitionList::new();
    query
        .add_partition_offset(topic, partition, Offset::Offset(t.timestamp_millis()))
        .map_err(|e| format!("kafka: {e}"))?;
    let found = consumer
        .offsets_for_times(query, std::time::Duration::from_secs(10))
        .map_err(|e| format!("kafka: finding the offsets at --since: {e}"))?;
    Ok(found
        .find_partition(topic, partition)
        .map(|p| p.offset())
        .filter(|o| matches!(o, Offset::Offset(_)))
        .unwrap_or(Offset::End))
}
