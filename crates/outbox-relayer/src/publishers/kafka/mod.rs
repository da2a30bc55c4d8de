//! Kafka (rdkafka, bundled librdkafka): an idempotent producer with `acks=all`; `Ok` is the
//! message's delivery report, so every in-sync replica has it. The record key is the aggregate
//! id (same partition, so per-aggregate order for consumers), the topic is the message's
//! destination, and every header of [`crate::wire::message::Message::visit_headers`] is a record header.
//!
//! Kafka has **no broker-side dedupe by event id**: the idempotent producer only drops the
//! duplicates of its own retries within one producer session. An event published again (the
//! relay crashed after the broker stored it but before the row was marked, or an ack timed
//! out) arrives twice, with the same `event-id` header, for the consumer's inbox to absorb.
//!
//! Errors are classified in one place: too large, invalid or unknown topic, topic or cluster
//! authorization failures are permanent; timeouts, transport failures, all brokers down,
//! queue full, leader changes and the rest are transient.

// Parts only its publisher uses are dead in a build without it.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
mod config;
#[cfg(feature = "kafka")]
mod probe;
#[cfg(feature = "kafka")]
mod publisher;

pub use config::{bootstrap_list, Compression, KafkaConfig, SaslMechanism, SecurityProtocol};
#[cfg(feature = "kafka")]
pub use probe::probe;
#[cfg(feature = "kafka")]
pub use publisher::{is_valid_topic, KafkaPublisher};
