//! # outbox-consumer
//!
//! The consuming side of the outbox. The relay delivers at least once; a consumer built here
//! applies each event's effect exactly once (guarantee G5):
//!
//! 1. decode the message into an [`Envelope`] (event id, type, schema version, aggregate,
//!    headers, payload; the relay's native headers or a CloudEvents 1.0 message, binary or
//!    structured) and bring it to the current version with the [`Upcasters`] — a message that
//!    cannot be decoded or upcast is dead-lettered with the reason;
//! 2. in one database transaction: record the event id in the inbox
//!    ([`outbox::postgres::PgInbox`]) and, only if it is new, run the [`Handler`];
//! 3. commit, and only then acknowledge the broker.
//!
//! A crash anywhere before the commit leaves nothing applied and the message redelivered; a
//! crash after the commit but before the ack leads to a redelivery that the inbox recognises
//! and skips. A handler that fails (or panics) is retried with backoff; after `max_attempts`
//! the message goes to the consumer's dead letter with its error, and later messages keep
//! flowing. A database outage is not the message's fault: the runner holds the message and
//! retries it until the database answers, spending none of its attempts. With a
//! [`VersionGate`] the events of each aggregate apply in `aggregate_version` order: a version
//! that arrives before its predecessor waits for it. [`ConsumerMetrics`] counts all of it.

mod cloudevents;
mod config;
pub mod dead_letters;
mod envelope;
mod error;
mod gate;
mod handler;
#[cfg(feature = "kafka")]
pub mod kafka;
mod lanes;
mod metrics;
#[cfg(feature = "nats")]
pub mod nats;
mod outage;
mod panic;
mod processor;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
pub mod saga;
mod trace;
mod upcast;

pub use config::ConsumerConfig;
pub use envelope::{DecodeError, Envelope};
pub use error::Error;
pub use gate::VersionGate;
pub use handler::{Handler, HandlerError};
pub use metrics::{ConsumerMetrics, Count};
pub use processor::{Outcome, Processor};
pub use upcast::{UpcastError, Upcaster, Upcasters};
