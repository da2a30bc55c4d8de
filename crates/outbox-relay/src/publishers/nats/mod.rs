//! NATS JetStream: waits for the PubAck; `Nats-Msg-Id` is the event id, so JetStream drops a
//! duplicate published within the stream's duplicate window (2 minutes by default).

mod config;
mod publisher;

pub use config::NatsConfig;
pub use publisher::{is_valid_subject, NatsPublisher};
