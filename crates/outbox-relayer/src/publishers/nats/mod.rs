//! NATS JetStream: waits for the PubAck; `Nats-Msg-Id` is the event id, so JetStream drops a
//! duplicate published within the stream's duplicate window (2 minutes by default). Messages
//! go out through the core client, their PubAcks come back through one inbox (`acks.rs`).
//! Only a reply that is a PubAck counts; the subjects an event may name are in `subjects.rs`.

// Parts only its publisher uses are dead in a build without it.
#[cfg(feature = "nats")]
mod acks;
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
mod config;
#[cfg(feature = "nats")]
mod probe;
#[cfg(feature = "nats")]
mod publisher;
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
mod subjects;

pub use config::NatsConfig;
#[cfg(feature = "nats")]
pub use probe::probe;
#[cfg(feature = "nats")]
pub use publisher::NatsPublisher;
#[cfg(feature = "nats")]
pub use subjects::is_valid_subject;
