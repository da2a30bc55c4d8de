//! NATS JetStream runner: a durable pull consumer with explicit acks. Failed messages are
//! NAKed with a delay (the server redelivers them while later messages flow); after
//! `max_attempts` deliveries, or at once when malformed, the message is published to the dead
//! letter subject (stream `{stream}_DEAD`) with its error, and only then terminated. While the
//! database is unreachable the message in hand is held (its ack deadline extended) and retried
//! until the database answers: an outage spends no attempt.

use std::{collections::BTreeMap, time::Duration};

use async_nats::{
    jetstream::{self, consumer::pull, stream, AckKind},
    HeaderMap,
};
use tokio_util::sync::CancellationToken;

use crate::{
    lanes::{self, Lane},
    outage, ConsumerConfig, Count, Envelope, Error, Processor,
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
    worker: Worker,
}

/// What handles one message: shared by the messages in flight.
struct Worker {
    js: jetstream::Context,
    config: ConsumerConfig,
    processor: Processor,
    dead_subject: String,
    ack_wait: Duration,
}

impl NatsConsumer {
    /// Creates (or binds to) the durable consumer `config.name` and the dead-letter stream.
    pub async fn connect(
        source: NatsSource,
        config: ConsumerConfig,
        processor: Processor,
    ) -> Result<Self, Error> {
        config.validate()?;
        let broker = |e: &dyn std::fmt::Display| Error::Broker(format!("nats: {e}"));
        let client = async_nats::connect(&source.url)
            .await
            .map_err(|e| broker(&e))?;
        let js = jetstream::new(client);
        let stream = js
            .get_stream(&source.stream)
            .await
            .map_err(|e| broker(&e))?;
        let dead_subject = format!("dead.{}.{}", source.stream, config.name);
        js.get_or_create_stream(stream::Config {
            name: format!("{}_DEAD_{}", source.stream, config.name),
            subjects: vec![dead_subject.clone()],
            ..Default::default()
        })
        .await
        .map_err(|e| broker(&e))?;
        let consumer = stream
            .get_or_create_consumer(
                &config.name,
                pull::Config {
                    durable_name: Some(config.name.clone()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: source.ack_wait,
                    filter_subjects: source.filter_subjects.clone(),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| broker(&e))?;
        let messages = consumer.messages().await.map_err(|e| broker(&e))?;
        Ok(Self {
            messages,
            worker: Worker {
                js,
                config,
                processor,
                dead_subject,
                ack_wait: source.ack_wait,
            },
        })
    }

    /// The subject dead letters are published to.
    pub fn dead_letter_subject(&self) -> &str {
        &self.worker.dead_subject
    }

    /// Processes messages until `shutdown`: up to `config.concurrency` at once, each
    /// aggregate's strictly one after another in the order received (a message waiting for
    /// its aggregate does not hold up others). The messages in hand are finished first.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Self { messages, worker } = self;
        lanes::drive(
            messages,
            worker.config.concurrency,
            &shutdown,
            lane_of,
            |e| {
                tracing::warn!(error = %e, "nats: receiving failed; retrying");
                None
            },
            || Error::Broker("nats: consumer stream ended".into()),
            |message| worker.handle(message, &shutdown),
        )
        .await
    }
}

impl Worker {
    async fn handle(&self, message: jetstream::Message, shutdown: &CancellationToken) {
        let delivered = message.info().map(|i| i.delivered).unwrap_or(1).max(1) as u32;
        let headers = message.headers.as_ref().map(headers_of).unwrap_or_default();
        let envelope = Envelope::decode(
            message.subject.to_string(),
            headers,
            message.payload.clone(),
        )
        .map_err(|e| e.to_string())
        // An event that cannot reach its current version never will: dead-letter it at once.
        .and_then(|e| self.processor.upcast(e).map_err(|e| e.to_string()));
        let result = match &envelope {
            Err(e) => Err((e.to_string(), true)),
            // During an outage the message is held, its ack deadline pushed back, until the
            // database answers.
            Ok(event) => outage::apply(
                "nats",
                &self.processor,
                event,
                shutdown,
                self.ack_wait / 3,
                || {
                    let message = &message;
                    async move {
                        let _ = message.ack_with(AckKind::Progress).await;
                    }
                },
            )
            .await
            .map_err(|e| {
                // Only the message's own failures dead-letter it: not an outage outlasting
                // shutdown, not a wait for an earlier version of its aggregate.
                let dead = e.counts_as_attempt() && delivered >= self.config.max_attempts;
                (e.to_string(), dead)
            }),
        };
        match result {
            Ok(outcome) => {
                tracing::debug!(?outcome, subject = %message.subject, "processed");
                if let Err(e) = message.ack().await {
                    tracing::warn!(error = %e, "ack failed; the message will be redelivered");
                }
            }
            Err((error, true)) => {
                tracing::error!(%error, delivered, subject = %message.subject,
                    consumer = self.processor.name(), "dead-lettering message");
                if self.dead_letter(&message, &error, delivered).await {
                    self.processor.count(Count::DeadLettered);
                    let _ = message.ack_with(AckKind::Term).await;
                } else {
                    let _ = message
                        .ack_with(AckKind::Nak(Some(self.config.backoff(delivered))))
                        .await;
                }
            }
            Err((error, false)) => {
                let delay = self.config.backoff(delivered);
                tracing::warn!(%error, delivered, ?delay, "handler failed; will redeliver");
                let _ = message.ack_with(AckKind::Nak(Some(delay))).await;
            }
        }
    }

    /// Publishes the message to the dead-letter subject and waits for the PubAck.
    async fn dead_letter(&self, message: &jetstream::Message, error: &str, delivered: u32) -> bool {
        // Keep the original headers except `Nats-Msg-Id`: the dead letter must always be stored.
        let mut headers = HeaderMap::new();
        for (name, values) in message.headers.iter().flat_map(|h| h.iter()) {
            if name.to_string() != "Nats-Msg-Id" {
                for value in values {
                    headers.append(name.clone(), value.clone());
                }
            }
        }
        headers.insert(
            "dead-letter-reason",
            error.replace(['\r', '\n'], " ").as_str(),
        );
        headers.insert("dead-letter-attempts", delivered.to_string().as_str());
        headers.insert("dead-letter-subject", message.subject.as_str());
        headers.insert("dead-letter-consumer", self.processor.name());
        match self
            .js
            .publish_with_headers(self.dead_subject.clone(), headers, message.payload.clone())
            .await
        {
            Ok(ack) => ack.await.is_ok(),
            Err(e) => {
                tracing::warn!(error = %e, "dead-letter publish failed; will retry");
                false
            }
        }
    }
}

/// The message's aggregate (`aggregate-type`, `aggregate-id` headers); a message without one
/// has a lane of its own.
fn lane_of(message: &jetstream::Message) -> Lane {
    let header = |name| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_owned())
    };
    match (header("aggregate-type"), header("aggregate-id")) {
        (Some(kind), Some(id)) => Lane::Aggregate(kind, id),
        _ => Lane::Alone(message.info().map(|i| i.stream_sequence).unwrap_or(0)),
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
