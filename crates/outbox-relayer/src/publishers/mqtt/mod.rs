//! MQTT 5 (rumqttc): QoS 1 publishes, the broker's PUBACK as the ack, the event's metadata as
//! user properties, the destination as the topic.
//!
//! Ok means the broker accepted the message (PUBACK with a success code). MQTT brokers keep a
//! message only for subscribers that exist (or have a persistent session) when it arrives: with
//! `require_subscribers` (default), a PUBACK saying "no matching subscribers" is a permanent
//! failure instead of a silent drop. MQTT has no message id, so no broker dedupe: a re-publish
//! arrives twice and the consumer's inbox drops it by the `event-id` property. Each publish has
//! a connection of its own until its PUBACK, so an ack is never attributed to another message.

// Parts only its publisher uses are dead in a build without it.
#[cfg_attr(not(feature = "mqtt"), allow(dead_code))]
mod config;
#[cfg(feature = "mqtt")]
mod publisher;

pub use config::MqttConfig;
#[cfg(feature = "mqtt")]
pub use publisher::{is_valid_topic, MqttPublisher};
