//! Kafka runner (rdkafka): a consumer group member named after the consumer, offsets committed
//! only for messages whose inbox transaction is done.
//!
//! - **Order.** Each aggregate (the `aggregate-type` and `aggregate-id` headers, else the record
//!   key) has a lane: its messages run one after another in partition order, up to
//!   `concurrency` lanes at once.
//! - **Offsets.** A partition's committed offset only moves up to its oldest message still in
//!   hand (every `commit_interval`, when partitions are revoked, and at shutdown). A crash
//!   redelivers from there; the inbox skips what was applied.
//! - **Failures.** Kafka has no per-message redelivery: a failing message is retried in place
//!   with backoff, holding only its aggregate (and its partition's commit). After
//!   `max_attempts`, or at once when malformed, it is produced to the dead-letter topic
//!   (`{consumer}.dead` by default) with `dead-letter-*` headers naming the reason, and only
//!   then counted as done. A database outage is waited out without spending attempts.
//! - **Rebalances.** Revoked partitions commit what is done first; their messages still queued
//!   are dropped (the new owner reads them again) and a message already running finishes. Its
//!   new owner's delivery of that message waits on the inbox row, so an aggregate's effects
//!   keep their order across the hand-over.
//! - **Memory.** At most `max_in_hand` messages are held: beyond it the assigned partitions
//!   are paused (the consumer keeps polling, so it stays in the group) and resumed at half.

mod context;
mod offsets;
pub(crate) mod record;
mod worker;

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{stream::FuturesUnordered, StreamExt};
use rdkafka::{
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{CommitMode, Consumer, StreamConsumer},
    error::{KafkaError, RDKafkaErrorCode},
    producer::FutureProducer,
    ClientConfig,
};
use tokio_util::sync::CancellationToken;

use crate::{
    lanes::{Lane, Lanes},
    ConsumerConfig, Error, Processor,
};
use context::{offset_list, Context};
use offsets::Offsets;
use worker::{Received, Worker};

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
    /// Where dead letters go; `None`: `{consumer}.dead`. Created (1 partition, the broker's
    /// default replication) when missing.
    pub dead_letter_topic: Option<String>,
    /// Messages held at once, running or queued (default 1,000).
    pub max_in_hand: usize,
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
            dead_letter_topic: None,
            max_in_hand: 1000,
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
        if self.max_in_hand == 0 {
            return config("max_in_hand", "must be 1 or more");
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
    worker: Worker,
    max_in_hand: usize,
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
            .set("group.id", &config.name)
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
            .map_err(|e| Error::Broker(format!("kafka: subscribe to {topics:?}: {e}")))?;
        Ok(Self {
            consumer,
            offsets,
            worker: Worker {
                producer,
                dead_topic,
                config,
                processor,
            },
            max_in_hand: source.max_in_hand,
            commit_interval: source.commit_interval,
        })
    }

    /// The topic dead letters are produced to.
    pub fn dead_letter_topic(&self) -> &str {
        &self.worker.dead_topic
    }

    /// Processes messages until `shutdown`; then finishes the messages running, commits what
    /// is done and leaves the group. Messages queued behind their aggregate are read again by
    /// whoever owns their partition next.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Self {
            consumer,
            offsets,
            worker,
            max_in_hand,
            commit_interval,
        } = self;
        let offsets = &*offsets;
        let mut stream = consumer.stream();
        let mut runs = Runs {
            lanes: Lanes::new(worker.config.concurrency),
            waiting: VecDeque::new(),
            held: 0,
        };
        let mut in_flight = FuturesUnordered::new();
        let run = |lane: Lane, message: Received| {
            let handled = worker.handle(message, &shutdown, offsets);
            async move { (lane, handled.await) }
        };
        let mut tick = tokio::time::interval(commit_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut paused = false;
        let mut receive_errors = 0u32;
        let mut alone = 0u64;
        let stopped = loop {
            tokio::select! {
                () = shutdown.cancelled() => break None,
                Some((lane, finished)) = in_flight.next(), if !in_flight.is_empty() => {
                    runs.held -= 1;
                    if let Some(ticket) = finished {
                        lock(offsets).done(&ticket);
                    }
                    for (lane, message) in runs.next_after(lane, offsets) {
                        in_flight.push(run(lane, message));
                    }
                }
                next = stream.next() => match next {
                    Some(Ok(message)) => {
                        receive_errors = 0;
                        let Some(received) = Received::of(&message, offsets, &mut alone) else {
                            continue;
                        };
                        runs.held += 1;
                        if let Some((lane, message)) = runs.admit(received) {
                            in_flight.push(run(lane, message));
                        }
                    }
                    Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                        break Some(Error::Broker(format!("kafka: fatal consumer error: {code}")));
                    }
                    Some(Err(e)) => {
                        receive_errors += 1;
                        if receive_errors.is_power_of_two() {
                            tracing::warn!(error = %e, receive_errors, "kafka: receiving failed; retrying");
                        }
                    }
                    None => break Some(Error::Broker("kafka: consumer stream ended".into())),
                },
                _ = tick.tick() => commit(&consumer, offsets, CommitMode::Async),
            }
            // Bounded memory: stop fetching while full (polling goes on, so the group keeps
            // this member), fetch again at half.
            if runs.held >= max_in_hand {
                if let Ok(assigned) = consumer.assignment() {
                    let _ = consumer.pause(&assigned);
                    paused = true;
                }
            } else if paused && runs.held <= max_in_hand / 2 {
                if let Ok(assigned) = consumer.assignment() {
                    let _ = consumer.resume(&assigned);
                }
                paused = false;
            }
        };
        while let Some((_, finished)) = in_flight.next().await {
            if let Some(ticket) = finished {
                lock(offsets).done(&ticket);
            }
        }
        commit(&consumer, offsets, CommitMode::Sync);
        drop(stream);
        consumer.unsubscribe();
        stopped.map_or(Ok(()), Err)
    }
}

/// The messages held: in their lanes, or waiting for a lane to be free.
struct Runs {
    lanes: Lanes<Received>,
    /// Messages whose aggregate has no lane yet, while every lane is busy, in arrival order.
    waiting: VecDeque<(Lane, Received)>,
    held: usize,
}

impl Runs {
    /// The message to run now, if its lane is free and there is room; otherwise it queues
    /// (behind its aggregate's running lane, or behind the messages already waiting).
    fn admit(&mut self, message: Received) -> Option<(Lane, Received)> {
        let lane = message.lane.clone();
        if self.lanes.is_running(&lane) || (self.waiting.is_empty() && self.lanes.has_room()) {
            return self.lanes.start(lane.clone(), message).map(|m| (lane, m));
        }
        self.waiting.push_back((lane, message));
        None
    }

    /// After `lane`'s message finished: the messages to run now (the lane's next current one,
    /// then waiting ones while there is room). Stale messages (their partition was revoked)
    /// are dropped on the way.
    fn next_after(&mut self, lane: Lane, offsets: &Mutex<Offsets>) -> Vec<(Lane, Received)> {
        let mut start = Vec::new();
        while let Some(next) = self.lanes.finished(&lane) {
            if lock(offsets).is_current(&next.ticket) {
                start.push((lane.clone(), next));
                break;
            }
            self.held -= 1;
        }
        while let Some((lane, message)) = self.waiting.pop_front() {
            if !lock(offsets).is_current(&message.ticket) {
                self.held -= 1;
                continue;
            }
            if !self.lanes.is_running(&lane) && !self.lanes.has_room() {
                self.waiting.push_front((lane, message));
                break;
            }
            if let Some(message) = self.lanes.start(lane.clone(), message) {
                start.push((lane, message));
            }
        }
        start
    }
}

fn lock(offsets: &Mutex<Offsets>) -> std::sync::MutexGuard<'_, Offsets> {
    offsets.lock().expect("offsets lock")
}

/// Commits the offsets that moved. A failed asynchronous commit is sent again by the next.
fn commit(consumer: &StreamConsumer<Context>, offsets: &Mutex<Offsets>, mode: CommitMode) {
    let done = lock(offsets).take_commit();
    if done.is_empty() {
        return;
    }
    if let Err(e) = consumer.commit(&offset_list(&done), mode) {
        tracing::warn!(error = %e, "kafka: offset commit failed; it is sent again");
        let mut offsets = lock(offsets);
        for (partition, _) in &done {
            offsets.commit_failed(partition);
        }
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
        .map_err(|e| Error::Broker(format!("kafka: create dead-letter topic {topic}: {e}")))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(Error::Broker(format!(
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
        other => Error::Broker(format!("kafka: cannot create the {what}: {other}")),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(id: &str) -> Lane {
        Lane::Aggregate("order".into(), id.into())
    }

    /// Two lanes at most; `b` and `c` wait for room in arrival order, `a`'s second message queues
    /// behind its first; messages of a revoked partition are dropped instead of run.
    #[test]
    fn messages_wait_for_room_in_order_and_stale_ones_are_dropped() {
        let offsets = Mutex::new(Offsets::default());
        let p0 = ("t".to_owned(), 0);
        let p1 = ("t".to_owned(), 1);
        lock(&offsets).assign(p0.clone());
        lock(&offsets).assign(p1.clone());
        let message = |p: &offsets::Partition, offset, id| {
            let ticket = lock(&offsets).received(p.clone(), offset).unwrap();
            Received::bare(ticket, lane(id))
        };
        let mut runs = Runs {
            lanes: Lanes::new(2),
            waiting: VecDeque::new(),
            held: 0,
        };
        let started = |r: Option<(Lane, Received)>| r.map(|(_, m)| m.ticket.offset);
        assert_eq!(started(runs.admit(message(&p0, 0, "a"))), Some(0));
        assert_eq!(started(runs.admit(message(&p1, 0, "x"))), Some(0));
        assert_eq!(started(runs.admit(message(&p0, 1, "b"))), None, "no room");
        assert_eq!(started(runs.admit(message(&p0, 2, "a"))), None, "behind a");
        assert_eq!(started(runs.admit(message(&p1, 1, "c"))), None, "no room");
        runs.held = 5;
        // `a`'s first finishes: its second runs, nothing else has room.
        let next: Vec<i64> = runs
            .next_after(lane("a"), &offsets)
            .into_iter()
            .map(|(_, m)| m.ticket.offset)
            .collect();
        assert_eq!(next, vec![2]);
        // Partition 1 is revoked: `c` (waiting) is dropped when its turn comes.
        assert_eq!(lock(&offsets).revoke(&p1), Some(0), "x still in hand");
        let next: Vec<(Lane, i64)> = runs
            .next_after(lane("x"), &offsets)
            .into_iter()
            .map(|(l, m)| (l, m.ticket.offset))
            .collect();
        assert_eq!(next, vec![(lane("b"), 1)], "b starts, c is stale");
        assert_eq!(runs.held, 4, "c no longer held");
        assert!(runs.waiting.is_empty());
    }
}
