//! NATS JetStream runner: a durable pull consumer with explicit acks. Every message is
//! acknowledged once it is applied, skipped as a duplicate, held in the consumer's database
//! (its turn has not come, or its first attempt failed: see [`crate::runner`]) or
//! dead-lettered: published to the dead-letter subject (stream `{stream}_DEAD_{consumer}`)
//! with its error, confirmed, and only then acknowledged. Nothing waits unacknowledged but the
//! messages in hand, at most `max_in_hand` (the consumer's `max_ack_pending` when the runner
//! creates it). While the database is unreachable the message in hand is kept (its ack
//! deadline extended) and retried until the database answers: an outage spends no attempt.

use std::{collections::BTreeMap, time::Duration};

use async_nats::{
    jetstream::{self, consumer::pull, stream, AckKind},
    HeaderMap,
};
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::{
    runner::{self, Delivery, Worker},
    ConsumerConfig, DeadLetters, Error, Message, Processor,
};

/// Where to consume from.
#[derive(Clone, Debug)]
pub struct NatsSource {
    /// Server URL.
    pub url: String,
    /// Stream to consume (the relay's, `OUTBOX` by default).
    pub stream: String,
    /// Subjects to take (`order.>`); empty takes the whole stream.
    pub filter_subjects: Vec<String>,
    /// Redelivery after this long without an ack (default 30s).
    pub ack_wait: Duration,
}

impl NatsSource {
    /// Consume `stream` on `url`, every subject, with the default ack wait.
    pub fn new(url: impl Into<String>, stream: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            stream: stream.into(),
            filter_subjects: Vec::new(),
            ack_wait: Duration::from_secs(30),
        }
    }
}

/// A running JetStream consumer.
pub struct NatsConsumer {
    messages: pull::Stream,
    worker: Worker<NatsDeadLetters>,
}

/// Refuses a durable consumer, created before the runner bound to it, whose settings lose
/// messages the runner has not applied: a delivery limit (`max_deliver`: JetStream stops
/// redelivering a message after it, so one released at a shutdown or in hand at a crash that
/// often is never seen again), an ack policy other than explicit (messages count as
/// acknowledged before they are applied), headers only (the payloads never reach the runner)
/// or other subjects than the runner's `filter_subjects` (messages of the others never reach
/// it, and nothing says so).
fn bound_safely(
    name: &str,
    existing: &jetstream::consumer::Config,
    wanted_subjects: &[String],
) -> Result<(), Error> {
    let fix = "delete it (nats consumer rm) and let the runner create it, or edit it";
    if existing.max_deliver > 0 {
        return Err(Error::broker_message(format!(
            "nats: durable consumer {name} has max_deliver {}: JetStream would stop \
             delivering a message after that many deliveries, unapplied; {fix} to \
             max_deliver -1",
            existing.max_deliver
        )));
    }
    if existing.ack_policy != jetstream::consumer::AckPolicy::Explicit {
        return Err(Error::broker_message(format!(
            "nats: durable consumer {name} has ack policy {:?}: messages would count as \
             acknowledged before they are applied; {fix} to ack policy explicit",
            existing.ack_policy
        )));
    }
    if existing.headers_only {
        return Err(Error::broker_message(format!(
            "nats: durable consumer {name} delivers headers only: the runner would apply \
             and dead-letter events without their payloads; {fix} to deliver whole messages"
        )));
    }
    let mut takes: Vec<&str> = existing
        .filter_subjects
        .iter()
        .map(String::as_str)
        .chain(Some(existing.filter_subject.as_str()).filter(|s| !s.is_empty()))
        .collect();
    let mut wanted: Vec<&str> = wanted_subjects.iter().map(String::as_str).collect();
    takes.sort_unstable();
    takes.dedup();
    wanted.sort_unstable();
    wanted.dedup();
    if takes != wanted {
        let all = |subjects: &[&str]| {
            if subjects.is_empty() {
                "every subject".to_owned()
            } else {
                subjects.join(", ")
            }
        };
        return Err(Error::broker_message(format!(
            "nats: durable consumer {name} takes {} but the runner's filter_subjects are {}: \
             messages of the others would never reach it; {fix} to the runner's subjects",
            all(&takes),
            all(&wanted)
        )));
    }
    Ok(())
}

/// The dead-letter subject of a consumer, on its own stream.
pub(crate) struct NatsDeadLetters {
    js: jetstream::Context,
    subject: String,
    consumer: String,
}

impl NatsConsumer {
    /// Creates (or binds to) the durable consumer `config.name` and the dead-letter stream.
    /// A consumer the runner creates has `max_ack_pending` = `config.max_in_hand`.
    pub async fn connect(
        source: NatsSource,
        config: ConsumerConfig,
        processor: Processor,
    ) -> Result<Self, Error> {
        config.validate()?;
        let client = async_nats::connect(&source.url)
            .await
            .map_err(|e| Error::broker("nats", e))?;
        let js = jetstream::new(client);
        let stream = js
            .get_stream(&source.stream)
            .await
            .map_err(|e| Error::broker("nats", e))?;
        let dead_subject = format!("dead.{}.{}", source.stream, config.name);
        js.get_or_create_stream(stream::Config {
            name: format!("{}_DEAD_{}", source.stream, config.name),
            subjects: vec![dead_subject.clone()],
            ..Default::default()
        })
        .await
        .map_err(|e| Error::broker("nats", e))?;
        let consumer = stream
            .get_or_create_consumer(
                &config.name,
                pull::Config {
                    durable_name: Some(config.name.clone()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: source.ack_wait,
                    max_ack_pending: i64::try_from(config.max_in_hand).unwrap_or(i64::MAX),
                    filter_subjects: source.filter_subjects.clone(),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| Error::broker("nats", e))?;
        bound_safely(
            &config.name,
            &consumer.cached_info().config,
            &source.filter_subjects,
        )?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| Error::broker("nats", e))?;
        Ok(Self {
            messages,
            worker: Worker {
                dead: NatsDeadLetters {
                    js,
                    subject: dead_subject,
                    consumer: config.name.clone(),
                },
                config,
                processor,
                system: "nats",
                outage_wait: source.ack_wait / 3,
            },
        })
    }

    /// The subject dead letters are published to.
    pub fn dead_letter_subject(&self) -> &str {
        &self.worker.dead.subject
    }

    /// Processes messages until `shutdown`: up to `config.concurrency` aggregates at once,
    /// each aggregate's strictly one after another in the order received (a message waiting
    /// for its aggregate does not hold up others), while the sweeper applies held events as
    /// they come due. The messages in hand are finished first.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Self { messages, worker } = self;
        runner::run(
            messages.map(|m| m.map(NatsDelivery::new)),
            &worker,
            &shutdown,
            |e| {
                tracing::warn!(error = %e, "nats: receiving failed; retrying");
                None
            },
            || Error::broker_message("nats: consumer stream ended"),
        )
        .await
    }
}

use futures::StreamExt as _;

/// A JetStream message, with its text form.
struct NatsDelivery {
    message: jetstream::Message,
    raw: Message,
    delivered: i64,
}

impl NatsDelivery {
    fn new(message: jetstream::Message) -> Self {
        let raw = Message::new(
            message.subject.to_string(),
            message.headers.as_ref().map(headers_of).unwrap_or_default(),
            message.payload.clone(),
        );
        let delivered = message.info().map(|i| i.delivered).unwrap_or(1);
        Self {
            message,
            raw,
            delivered,
        }
    }
}

impl Delivery for NatsDelivery {
    fn message(&self) -> &Message {
        &self.raw
    }

    fn redelivered(&self) -> bool {
        self.delivered > 1
    }

    async fn ack(self) {
        if let Err(e) = self.message.ack().await {
            tracing::warn!(error = %e, "ack failed; the message will be redelivered");
        }
    }

    async fn release(self) {
        let _ = self.message.ack_with(AckKind::Nak(None)).await;
    }

    async fn keep(&self) {
        let _ = self.message.ack_with(AckKind::Progress).await;
    }
}

impl DeadLetters for NatsDeadLetters {
    /// Publishes to the dead-letter subject and waits for the PubAck.
    fn dead_letter<'a>(
        &'a self,
        message: &'a Message,
        reason: &'a str,
        attempts: u32,
        origin: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            // The original headers except `Nats-Msg-Id`: the dead letter must always be stored.
            let mut headers = HeaderMap::new();
            for (name, value) in &message.headers {
                if !name.eq_ignore_ascii_case("Nats-Msg-Id") {
                    headers.insert(name.as_str(), value.as_str());
                }
            }
            headers.insert(
                "dead-letter-reason",
                reason.replace(['\r', '\n'], " ").as_str(),
            );
            headers.insert("dead-letter-attempts", attempts.to_string().as_str());
            headers.insert("dead-letter-subject", message.destination.as_str());
            headers.insert("dead-letter-consumer", self.consumer.as_str());
            for (name, value) in origin {
                headers.insert(*name, value.as_str());
            }
            let ack = self
                .js
                .publish_with_headers(self.subject.clone(), headers, message.payload.clone())
                .await
                .map_err(|e| e.to_string())?;
            ack.await.map(drop).map_err(|e| e.to_string())
        })
    }
}

/// A message's headers, the first value of each.
pub(crate) fn headers_of(headers: &HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                v.first().map(|x| x.as_str().to_owned()).unwrap_or_default(),
            )
        })
        .collect()
}

/// Convenience: connect and run until `shutdown`.
pub async fn run(
    source: NatsSource,
    config: ConsumerConfig,
    processor: Processor,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    NatsConsumer::connect(source, config, processor)
        .await?
        .run(shutdown)
        .await
}
