//! AWS SQS (aws-sdk-sqs): standard and FIFO queues, `SendMessageBatch` with per-entry results.
//!
//! * **Ok** means SQS accepted the message's entry of a `SendMessageBatch` (it reported the
//!   entry successful): SQS stores a message redundantly before it answers.
//! * **Destination**: a queue name (its URL is found with `GetQueueUrl` once, then cached) or
//!   a queue URL. A name ending in `.fifo` is a FIFO queue.
//! * **Order**: FIFO queues keep each aggregate's order: the message group id is the ordering
//!   key (`aggregate_type:aggregate_id`). Standard queues promise no order at all: consumers
//!   of a standard queue must not rely on per-aggregate order (G4 ends at the broker there).
//! * **Dedupe**: FIFO queues: the deduplication id is the event id, so SQS drops a copy sent
//!   within its 5-minute window. Standard queues do not dedupe; the `event-id` attribute is
//!   the consumer's inbox key.
//! * **Metadata**: message attributes (SQS allows 10): the relay's standard headers each as
//!   one; the writer's headers each as one when they all fit, otherwise together as one JSON
//!   object in `outbox-headers`. The body is the payload when it is valid SQS text (UTF-8 of
//!   the characters SQS allows); otherwise its base64, with `outbox-body-encoding: base64`.
//! * **Batching**: concurrent publishes to one queue share requests of up to 10 entries (see the
//!   `batch` module); a failed entry fails only its own publish, classified on its own error code.

#[cfg(feature = "sqs")]
mod batch;
// Parts only its publisher uses are dead in a build without it.
#[cfg_attr(not(feature = "sqs"), allow(dead_code))]
mod config;
#[cfg_attr(not(feature = "sqs"), allow(dead_code))]
mod encode;
#[cfg(feature = "sqs")]
mod publisher;

pub use config::SqsConfig;
pub use encode::{decode_body, decode_headers, BODY_ENCODING_ATTRIBUTE, HEADERS_ATTRIBUTE};
#[cfg(feature = "sqs")]
pub use publisher::SqsPublisher;
