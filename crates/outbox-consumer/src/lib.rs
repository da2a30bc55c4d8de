//! # outbox-consumer
//!
//! The consuming side of the outbox. The relay delivers at least once; a consumer built here
//! applies each event's effect once, in order per aggregate (guarantee G5):
//!
//! 1. decode the message into an [`Envelope`] (event id, type, schema version, aggregate,
//!    headers, payload; the relay's native headers or a CloudEvents 1.0 message, binary or
//!    structured) and bring it to the current version with the [`Upcasters`] — a message that
//!    cannot be decoded or upcast is dead-lettered with the reason;
//! 2. in one database transaction: record the event in the inbox and, only if it is new and
//!    its turn has come (the [`VersionGate`]: its aggregate's versions in order), run the
//!    [`Handler`]; an event whose turn has not come is stored in the consumer's database
//!    instead (*held*), to be applied when it comes;
//! 3. commit, and only then acknowledge the broker.
//!
//! A crash anywhere before the commit leaves nothing applied and the message redelivered; a
//! crash after the commit but before the ack leads to a redelivery that the inbox recognises
//! and skips. A handler that fails (or panics) is held and tried again with backoff; after
//! `max_attempts` the message goes to the consumer's dead letter with its error, and later
//! messages keep flowing. A database outage is not the message's fault: the runner keeps the
//! message and retries it until the database answers, spending none of its attempts. Nothing
//! waits in the broker's in-flight window, so a gap in one aggregate never stops another.
//! [`ConsumerMetrics`] counts all of it; [`versions`] is what operators read and change.

mod cloudevents;
mod config;
pub mod dead_letters;
mod envelope;
mod error;
mod gate;
mod handler;
#[cfg(feature = "kafka")]
pub mod kafka;
mod message;
mod metrics;
#[cfg(feature = "nats")]
pub mod nats;
mod outage;
mod panic;
mod processor;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
mod runner;
pub mod saga;
#[cfg(test)]
mod sim;
mod store;
mod trace;
mod typed;
mod upcast;
pub mod versions;
#[cfg(feature = "webhook")]
pub mod webhook;

/// The README's examples, compiled as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use config::ConsumerConfig;
pub use envelope::{DecodeError, Envelope};
pub use error::Error;
pub use gate::{VersionGate, DEFAULT_SETTLE};
pub use handler::{Handler, HandlerError};
pub use message::Message;
pub use metrics::{ConsumerMetrics, Count};
pub use processor::{DeadLetters, Outcome, Processor};
pub use typed::{Handle, Handlers};
pub use upcast::{UpcastError, Upcaster, Upcasters};
#[cfg(feature = "webhook")]
pub use webhook::WebhookVerifier;
