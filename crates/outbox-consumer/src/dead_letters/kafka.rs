//! The dead letters of a Kafka consumer: topic `{consumer}.dead` (or the one it was given),
//! each record with its origin in `dead-letter-topic`, `-partition` and `-offset`.
//!
//! Kafka cannot delete one record, so a replay appends a marker to the dead-letter topic:
//! an empty record with the header `dead-letter-replayed: {partition}:{offset}`. Listing reads
//! the topic from its start and leaves out the letters that have a marker (and the markers).
//! Replay produces the letter to its original topic with its key, so it lands in its
//! aggregate's partition after the events already there; other consumer groups of that topic
//! skip it as a duplicate through their inbox.

use std::{
    collections::{BTreeMap, HashSet},
    time::Duration,
};

use rdkafka::{
    consumer::{BaseConsumer, Consumer},
    message::Message as _,
    producer::FutureProducer,
    util::Timeout,
    ClientConfig, Offset, TopicPartitionList,
};

use super::{DeadLetter, Error, Replayed, Selection, DEAD_LETTER_HEADERS};
use crate::kafka::record::{self, RawHeaders};

/// The marker a replay appends to the dead-letter topic.
const REPLAYED: &str = "dead-letter-replayed";
/// How long reading the topic or a delivery may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The dead letters of one Kafka consumer.
pub struct KafkaDeadLetters {
    config: ClientConfig,
    topic: String,
    producer: FutureProducer,
}

/// A dead letter as stored.
struct Stored {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    headers: RawHeaders,
    payload: Vec<u8>,
    letter: DeadLetter,
}

impl KafkaDeadLetters {
    /// Opens the dead-letter topic `topic` on `brokers` (comma-separated).
    pub async fn open(brokers: &str, topic: &str) -> Result<Self, Error> {
        Self::open_with(brokers, topic, &BTreeMap::new()).await
    }

    /// [`KafkaDeadLetters::open`] with more librdkafka properties (`security.protocol`,
    /// `sasl.*`, `ssl.*`, …), as the consumer's runner was given them. An error names a bad
    /// property, never its value.
    pub async fn open_with(
        brokers: &str,
        topic: &str,
        properties: &BTreeMap<String, String>,
    ) -> Result<Self, Error> {
        let mut config = ClientConfig::new();
        for (key, value) in properties {
            config.set(key, value);
        }
        config.set("bootstrap.servers", brokers);
        let producer: FutureProducer = config
            .clone()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()
            .map_err(|e| match e {
                rdkafka::error::KafkaError::ClientConfig(_, description, key, _) => {
                    Error::broker_message(format!("kafka: property {key:?}: {description}"))
                }
                other => Error::broker("kafka: cannot create a producer", other),
            })?;
        let letters = Self {
            config,
            topic: topic.to_owned(),
            producer,
        };
        // Fails early, naming the topic, when it does not exist.
        letters.partitions().await?;
        Ok(letters)
    }

    /// Where the dead letters are, for messages and the audit record.
    pub fn source(&self) -> String {
        format!("kafka topic {}", self.topic)
    }

    /// The dead letters matching `selection`, oldest first (per partition).
    pub async fn list(&self, selection: &Selection) -> Result<Vec<DeadLetter>, Error> {
        Ok(self
            .read(selection)
            .await?
            .into_iter()
            .map(|s| s.letter)
            .collect())
    }

    /// Produces each dead letter matching `selection` back to its original topic (delivery
    /// confirmed), then marks it replayed. Stops at the first failure.
    pub async fn replay(&self, selection: &Selection) -> Result<Replayed, Error> {
        let mut replayed = Replayed::default();
        for stored in self.read(selection).await? {
            if let Err(e) = self.replay_one(&stored).await {
                replayed.failure = Some(e);
                break;
            }
            replayed.letters.push(stored.letter);
        }
        Ok(replayed)
    }

    async fn replay_one(&self, stored: &Stored) -> Result<(), Error> {
        let origin = &stored.letter.origin;
        let place = format!("{}:{}", stored.partition, stored.offset);
        let failed = |e: &dyn std::fmt::Display| {
            Error::broker(
                format!(
                    "kafka: replaying dead letter {place} of {} to {origin}",
                    self.topic
                ),
                e.to_string(),
            )
        };
        if origin.is_empty() {
            return Err(failed(&"it has no dead-letter-topic header"));
        }
        let headers = record::owned_headers(
            &stored.headers,
            |key| !DEAD_LETTER_HEADERS.contains(&key),
            &[],
        );
        let letter = record::record(origin, stored.key.as_deref(), &stored.payload, headers);
        self.producer
            .send(letter, Timeout::After(TIMEOUT))
            .await
            .map_err(|(e, _)| failed(&e))?;
        let marker = record::owned_headers(&Vec::new(), |_| false, &[(REPLAYED, &place)]);
        self.producer
            .send(
                record::record(&self.topic, None, &[], marker),
                Timeout::After(TIMEOUT),
            )
            .await
            .map_err(|(e, _)| failed(&format!("marking it replayed: {e}")))?;
        Ok(())
    }

    /// The topic's partitions.
    async fn partitions(&self) -> Result<Vec<i32>, Error> {
        let consumer = self.reader()?;
        let topic = self.topic.clone();
        tokio::task::spawn_blocking(move || {
            let metadata = consumer
                .fetch_metadata(Some(&topic), TIMEOUT)
                .map_err(|e| Error::broker(format!("kafka: reading topic {topic}"), e))?;
            let found = metadata.topics().iter().find(|t| t.name() == topic);
            match found {
                Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                    Ok(t.partitions().iter().map(|p| p.id()).collect())
                }
                _ => Err(Error::broker_message(format!(
                    "kafka: no dead-letter topic {topic} (has the consumer run?)"
                ))),
            }
        })
        .await
        .map_err(|e| Error::broker(format!("kafka: reading {}", self.topic), e))?
    }

    fn reader(&self) -> Result<BaseConsumer, Error> {
        self.config
            .clone()
            .set("group.id", "outbox-dead-letter-reader")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .create()
            .map_err(|e| Error::broker("kafka: cannot create a reader", e))
    }

    /// Every dead letter not replayed yet that matches `selection`, up to its limit.
    async fn read(&self, selection: &Selection) -> Result<Vec<Stored>, Error> {
        let partitions = self.partitions().await?;
        let consumer = self.reader()?;
        let topic = self.topic.clone();
        let selection = selection.clone();
        tokio::task::spawn_blocking(move || read_all(&consumer, &topic, &partitions, &selection))
            .await
            .map_err(|e| Error::broker(format!("kafka: reading {}", self.topic), e))?
    }
}

/// Reads `partitions` of `topic` from the start to their current end.
fn read_all(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: &[i32],
    selection: &Selection,
) -> Result<Vec<Stored>, Error> {
    let broker =
        |e: rdkafka::error::KafkaError| Error::broker(format!("kafka: reading {topic}"), e);
    let mut ends = Vec::new();
    let mut assignment = TopicPartitionList::new();
    for &partition in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, TIMEOUT)
            .map_err(broker)?;
        if high > low {
            ends.push((partition, high));
            assignment
                .add_partition_offset(topic, partition, Offset::Offset(low))
                .map_err(broker)?;
        }
    }
    consumer.assign(&assignment).map_err(broker)?;
    let mut letters = Vec::new();
    let mut replayed = HashSet::new();
    let mut left: Vec<(i32, i64)> = ends;
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !left.is_empty() {
        if std::time::Instant::now() > deadline {
            return Err(Error::broker_message(format!(
                "kafka: reading {topic}: timed out before reaching the end of the topic"
            )));
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.map_err(broker)?;
        let (partition, offset) = (message.partition(), message.offset());
        left.retain(|(p, end)| *p != partition || offset + 1 < *end);
        let headers = record::raw_headers(&message);
        if let Some(place) = record::text(&headers, REPLAYED) {
            replayed.insert(place);
            continue;
        }
        let payload = message.payload().unwrap_or_default().to_vec();
        let letter = DeadLetter::from_headers(
            &record::text_headers(&headers),
            record::text(&headers, "dead-letter-topic").unwrap_or_default(),
            payload.len(),
        );
        letters.push(Stored {
            partition,
            offset,
            key: message.key().map(<[u8]>::to_vec),
            headers,
            payload,
            letter,
        });
    }
    Ok(letters
        .into_iter()
        .filter(|s| !replayed.contains(&format!("{}:{}", s.partition, s.offset)))
        .filter(|s| selection.matches(&s.letter))
        .take(selection.limit)
        .collect())
}
