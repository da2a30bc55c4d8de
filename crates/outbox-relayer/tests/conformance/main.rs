//! The publisher conformance suite: the same behaviour tests for every publisher, each against
//! its real broker and read back with that broker's own client. A broker joins by implementing
//! [`suite::Harness`] in a module here and invoking [`conformance_tests!`] in it.
//!
//! What every publisher must show (see `Publisher`'s contract):
//! * the payload arrives byte for byte, with event id, type, schema version, aggregate key and
//!   the writer's headers readable by a consumer;
//! * per-aggregate order is kept while many aggregates publish concurrently;
//! * an oversized message, and an unroutable one where the broker has that notion, fail as
//!   permanent;
//! * an unreachable broker fails as transient (and promptly), and publishing recovers once it
//!   is up, losing nothing;
//! * a second publish of the same event id is dropped where the broker dedupes, and arrives
//!   twice (same event id, for the consumer's inbox) where it does not.

mod suite;

mod amqp1;
mod kafka;
mod mqtt;
mod nats;
mod rabbitmq;
mod redis;
mod sqs;
mod webhook;
