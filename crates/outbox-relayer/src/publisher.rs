//! The seam between the relay and a broker.

use std::fmt;

use futures::future::BoxFuture;

use crate::wire::message::Message;

/// A broker client the relay publishes through.
///
/// # Contract
///
/// * `publish` returns `Ok(())` **only after the broker acknowledged the message durably**
///   (JetStream PubAck, RabbitMQ publisher confirm, Kafka delivery report with `acks=all`, …).
///   The relay marks the event published on `Ok` and never before (guarantee G3).
/// * The message body is `message.payload`, byte for byte. The event id, type, schema version,
///   aggregate key and headers travel as broker headers/properties
///   ([`Message::broker_headers`]); the event id is the broker message id and, where the broker
///   has one, its dedupe key; the aggregate id is the partition/ordering key.
/// * The relay calls `publish` for one aggregate strictly one message at a time, the next only
///   after the previous returned `Ok`. Calls for different aggregates run concurrently, so an
///   implementation must be safe to call from many tasks at once and must not reorder a
///   single caller's message.
/// * An error says what the relay should do through its [`FailureClass`]: transient errors are
///   retried with backoff forever; permanent ones dead-letter the event after the configured
///   attempts. A timeout waiting for the ack is transient: the message may have been delivered,
///   and the retry produces a duplicate, which the dedupe key absorbs where the broker has one.
pub trait Publisher: Send + Sync + 'static {
    /// Publishes one message and waits for the broker's acknowledgement.
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>>;

    /// A short name for logs and metrics (`nats`, `rabbitmq`).
    fn name(&self) -> &'static str;

    /// Largest payload the broker accepts; larger events are dead-lettered without an attempt.
    fn max_payload_bytes(&self) -> usize;

    /// Checks that `destination` is valid for this broker (subject syntax, routing key length).
    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        let _ = destination;
        Ok(())
    }
}

/// Refuses, as permanent, a message whose payload is over `limit` bytes: every publisher calls
/// it before sending, so a message too large for the broker never reaches it, whoever calls.
pub fn check_payload_size(message: &Message, limit: usize) -> Result<(), PublishError> {
    if message.payload.len() > limit {
        return Err(PublishError::permanent(format!(
            "payload is {} bytes, over the broker limit of {limit} bytes",
            message.payload.len()
        )));
    }
    Ok(())
}

/// How the relay reacts to a failure. Decided in one place per publisher, from the broker's
/// error, and nowhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureClass {
    /// The broker is down, slow, throttling or the connection broke: retry with exponential
    /// backoff, never dead-letter for this alone, and pause the whole publisher while it lasts.
    Transient,
    /// The message itself cannot be delivered (too large, unroutable, rejected, malformed row):
    /// retry up to the configured attempts, then dead-letter it and park its aggregate.
    Permanent,
}

/// A failed publish (or a row that cannot be published), with its class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishError {
    /// What the relay does about it.
    pub class: FailureClass,
    /// Human-readable reason, stored in the row's `last_error`. Never contains credentials.
    pub message: String,
}

impl PublishError {
    /// A transient failure.
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            class: FailureClass::Transient,
            message: message.into(),
        }
    }

    /// A permanent failure.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            class: FailureClass::Permanent,
            message: message.into(),
        }
    }

    /// Whether it is transient.
    pub fn is_transient(&self) -> bool {
        self.class == FailureClass::Transient
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let class = match self.class {
            FailureClass::Transient => "transient",
            FailureClass::Permanent => "permanent",
        };
        write!(f, "{class}: {}", self.message)
    }
}

impl std::error::Error for PublishError {}
