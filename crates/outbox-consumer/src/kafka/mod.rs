//! Kafka runner (rdkafka): a consumer group member named after the consumer, offsets committed
//! only for messages whose inbox transaction is done.
//!
//! - **Order.** Each aggregate (read from the decoded event, either envelope) has a lane: its
//!   messages run one after another in the order read, up to `concurrency` lanes at once.
//! - **Offsets.** A partition's committed offset only moves up to its oldest message still in
//!   hand (every `commit_interval`, when partitions are revoked, and at shutdown). A crash
//!   redelivers from there; the inbox skips what was applied.
//! - **Waiting and failures.** A record whose turn has not come (an earlier version of its
//!   aggregate not applied yet, on this topic or another: Kafka orders nothing between
//!   topics), and one whose first attempt failed, is held in the consumer's database and
//!   counted as done: its partition's offset moves on, and the sweeper applies it when its
//!   turn (or its next attempt) comes (see [`crate::runner`]). After `max_attempts`, or at once
//!   when malformed, it is produced to the dead-letter topic (`{consumer}.dead` by default)
//!   with `dead-letter-*` headers naming the reason. A database outage is waited out, the
//!   record in hand, without spending attempts.
//! - **Rebalances.** Revoked partitions commit what is done first; their messages still queued
//!   are dropped (the new owner reads them again) and a message already running finishes. Its
//!   new owner's delivery of that message waits on the inbox row, so an aggregate's effects
//!   keep their order across the hand-over.
//! - **Memory.** At most `config.max_in_hand` messages are held: beyond it the assigned partitions
//!   are paused (the consumer keeps polling, so it stays in the group) and resumed at half.

pub(crate) mod consume;
mod context;
pub(crate) mod delivery;
pub(crate) mod offsets;
pub(crate) mod record;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use rdkafka::message::Message as _;
use rdkafka::{
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{CommitMode, Consumer, StreamConsumer},
    error::{KafkaError, RDKafkaErrorCode},
    producer::FutureProducer,
    ClientConfig,
};
use tokio_util::sync::CancellationToken;

use crate::{runner::Worker, ConsumerConfig, Error, Processor};
use consume::{Control, Receive};
use context::{offset_list, Context};
use delivery::{KafkaDeadLetters, KafkaDelivery};
use offsets::Offsets;

pub(crate) fn lock(offsets: &Mutex<Offsets>) -> std::sync::MutexGuard<'_, Offsets> {
    offsets.lock().expect("offsets lock")
}

/// The longest wait between tries while the database is down.
const OUTAGE_WAIT: Duration = Duration::from_secs(5);

/// Properties the runner sets itself: its guarantees depend on them.
const RESERVED: [&str; 4] = [
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "bootstrap.servers",
];

/// Where to consume from.
#[derive(Clone, Debug)]
pub struct KafkaSource {
    /// Bootstrap servers, comma-separated (`host:9092,host2:9092`).
    pub brokers: String,
    /// Topics to consume (the relay's destinations).
    pub topics: Vec<String>,
    /// The consumer group; `None`: the consumer's name (one group per consumer, as one durable
    /// consumer per consumer on NATS). Another group reads every record again, applying each
    /// once through the inbox of the same consumer name.
    pub group_id: Option<String>,
    /// Where dead letters go; `None`: `{consumer}.dead`. Created (1 partition, the broker's
    /// default replication) when missing.
    pub dead_letter_topic: Option<String>,
    /// How often done offsets are committed (default 1 s).
    pub commit_interval: Duration,
    /// More librdkafka properties for the consumer, the dead-letter producer and the admin
    /// client (`security.protocol`, `sasl.*`, `session.timeout.ms`, …). `group.id`,
    /// `bootstrap.servers` and the auto-commit settings are the runner's own.
    pub properties: BTreeMap<String, String>,
}

impl KafkaSource {
    /// Consume `topics` from `brokers` with the defaults.
    pub fn new(brokers: impl Into<String>, topics: &[&str]) -> Self {
        Self {
            brokers: brokers.into(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            group_id: None,
            dead_letter_topic: None,
            commit_interval: Duration::from_secs(1),
            properties: BTreeMap::new(),
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let config = |field: &str, why: &str| Err(Error::Config(format!("kafka.{field}: {why}")));
        if self.brokers.trim().is_empty() {
            return config("brokers", "must name at least one broker");
        }
        if self.topics.is_empty() || self.topics.iter().any(|t| t.trim().is_empty()) {
            return config("topics", "must name at least one topic, none empty");
        }
        if self.commit_interval.is_zero() {
            return config("commit_interval", "must be more than 0");
        }
        if let Some(key) = self
            .properties
            .keys()
            .find(|k| RESERVED.contains(&k.as_str()))
        {
            return config(
                &format!("properties.{key:?}"),
                "is set by the runner (offsets are committed only after the inbox commit)",
            );
        }
        Ok(())
    }

    /// The librdkafka settings shared by the consumer, producer and admin client.
    fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        for (key, value) in &self.properties {
            c.set(key, value);
        }
        c
    }
}

/// A running Kafka consumer.
pub struct KafkaConsumer {
    consumer: StreamConsumer<Context>,
    offsets: Arc<Mutex<Offsets>>,
    worker: Worker<KafkaDeadLetters>,
    commit_interval: Duration,
}

impl KafkaConsumer {
    /// Creates the dead-letter topic when missing, joins the consumer group `config.name` and
    /// subscribes to `source.topics`.
    pub async fn connect(
        source: KafkaSource,
        config: ConsumerConfig,
        processor: Processor,
    ) -> Result<Self, Error> {
        config.validate()?;
        source.validate()?;
        let dead_topic = source
            .dead_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dead", config.name));
        create_if_missing(&source, &dead_topic).await?;
        let producer: FutureProducer = source
            .client_config()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()
            .map_err(|e| created("dead-letter producer", e))?;
        let offsets = Arc::new(Mutex::new(Offsets::default()));
        let consumer: StreamConsumer<Context> = source
            .client_config()
            .set(
                "group.id",
                source.group_id.as_deref().unwrap_or(&config.name),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .create_with_context(Context {
                offsets: offsets.clone(),
                consumer: config.name.clone(),
            })
            .map_err(|e| created("consumer", e))?;
        let topics: Vec<&str> = source.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| Error::broker(format!("kafka: subscribe to {topics:?}"), e))?;
        Ok(Self {
            consumer,
            offsets,
            worker: Worker {
                dead: KafkaDeadLetters {
                    producer,
                    topic: dead_topic,
                    consumer: config.name.clone(),
                },
                config,
                processor,
                system: "kafka",
                outage_wait: OUTAGE_WAIT,
            },
            commit_interval: source.commit_interval,
        })
    }

    /// The topic dead letters are produced to.
    pub fn dead_letter_topic(&self) -> &str {
        &self.worker.dead.topic
    }

    /// Processes messages until `shutdown`, while the sweeper applies held events as they
    /// come due; then finishes the messages running, commits what is done and leaves the
    /// group. Messages queued behind their aggregate are read again by whoever owns their
    /// partition next.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        crate::runner::with_sweeper(&self.worker, &shutdown, self.consume(&shutdown)).await
    }

    async fn consume(&self, shutdown: &CancellationToken) -> Result<(), Error> {
        let stream = self.consumer.stream().map(|next| match next {
            Ok(message) => match KafkaDelivery::of(&message, &self.offsets) {
                Some(delivery) => Receive::Record(delivery),
                None => {
                    tracing::debug!(
                        topic = message.topic(),
                        partition = message.partition(),
                        offset = message.offset(),
                        "kafka: record of a partition not assigned here: skipped"
                    );
                    Receive::Skipped
                }
            },
            Err(KafkaError::MessageConsumptionFatal(code)) => Receive::Fatal(code.to_string()),
            Err(e) => Receive::Transient(e.to_string()),
        });
        let result = consume::consume(
            stream,
            &Client(&self.consumer),
            &self.offsets,
            &self.worker,
            self.worker.config.max_in_hand,
            self.commit_interval,
            shutdown,
        )
        .await;
        self.consumer.unsubscribe();
        result
    }
}

/// The rdkafka consumer, as the loop controls it.
struct Client<'a>(&'a StreamConsumer<Context>);

impl Control for Client<'_> {
    fn pause(&self, paused: bool) {
        if let Ok(assigned) = self.0.assignment() {
            let _ = if paused {
                self.0.pause(&assigned)
            } else {
                self.0.resume(&assigned)
            };
        }
    }

    fn commit(&self, done: &[(offsets::Partition, i64)], sync: bool) -> Result<(), String> {
        let mode = if sync {
            CommitMode::Sync
        } else {
            CommitMode::Async
        };
        self.0
            .commit(&offset_list(done), mode)
            .map_err(|e| e.to_string())
    }
}

/// Creates `topic` (1 partition, the broker's default replication) unless it exists.
async fn create_if_missing(source: &KafkaSource, topic: &str) -> Result<(), Error> {
    let admin: AdminClient<DefaultClientContext> = source
        .client_config()
        .create()
        .map_err(|e| created("admin client", e))?;
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, 1, TopicReplication::Fixed(-1))],
            &options,
        )
        .await
        .map_err(|e| Error::broker(format!("kafka: create dead-letter topic {topic}"), e))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(Error::broker_message(format!(
                    "kafka: create dead-letter topic {topic}: {code} (create it, or name \
                     another in dead_letter_topic)"
                )))
            }
        }
    }
    Ok(())
}

/// A librdkafka client could not be created: a bad property is a configuration error (its
/// value is not repeated: it may be a secret).
fn created(what: &str, e: KafkaError) -> Error {
    match e {
        KafkaError::ClientConfig(_, description, key, _) => {
            Error::Config(format!("kafka.properties.{key:?}: {description}"))
        }
        other => Error::broker(format!("kafka: cannot create the {what}"), other),
    }
}

/// Convenience: connect and run until `shutdown`.
pub async fn run(
    source: KafkaSource,
    config: ConsumerConfig,
    processor: Processor,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    KafkaConsumer::connect(source, config, processor)
        .await?
        .run(shutdown)
        .await
}
