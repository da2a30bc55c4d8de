//! # outbox-relayer
//!
//! Publishes committed outbox rows to a broker: at least once, in order per aggregate, with any
//! number of relay instances at once.
//!
//! ```text
//!  outbox table ──► claim ──► dispatcher ──► publisher ──► broker
//!  (pending rows    (leased     (ordered lanes,   (one per broker,   ack
//!   of my partitions) partitions) retry, DLQ)       confirms)         │
//!        ▲                                                             │
//!        └───────── completer (mark published / failed, fenced) ◄──────┘
//! ```
//!
//! * **Partitions and leases** ([`lease`]): `partition = hash(aggregate key) mod P`. Instances
//!   claim partitions through the `leases` table with heartbeats, expiry and a fencing epoch;
//!   every state change is conditional on the epoch still being held. Live instances rebalance.
//! * **Claim by state** ([`store`]): a claim reads the *pending* rows of the partitions it owns,
//!   whatever their id. There is no high-water mark, so a transaction that commits late is
//!   published when it becomes visible.
//! * **Ordered lanes** ([`dispatch`]): within a batch, aggregates are published concurrently,
//!   the events of one aggregate one after another, each only after the previous one's ack.
//! * **Failures** ([`publisher::FailureClass`]): transient errors retry with backoff and never
//!   dead-letter; permanent ones dead-letter after the configured attempts and park the aggregate.
//!
//! * **Versioning** ([`fanout`], [`cloudevents`], [`outgoing`]): a routing rule can publish
//!   one stored event as several schema versions during a migration, and events can go out
//!   as CloudEvents 1.0 (binary or structured mode) instead of the native headers.
//!
//! The entry point is [`Relay::builder`].

pub mod admin;
mod builder;
mod complete;
pub mod config;
pub mod dashboard;
mod db;
pub mod dispatch;
pub mod doctor;
mod error;
pub mod health;
pub mod http;
pub mod lease;
mod maintenance;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod publisher;
pub mod publishers;
pub mod redact;
mod relay;
pub mod retry;
pub mod source;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod store;
pub mod telemetry;
pub mod verify;
pub mod wire;

#[cfg(feature = "postgres")]
pub use source::cdc;
pub use wire::{cloudevents, fanout, message, outgoing, routing};

pub use builder::{RelayBuilder, Storage};
pub use config::{Mode, RelayConfig};
pub use error::Error;
pub use message::Message;
pub use publisher::{check_payload_size, FailureClass, PublishError, Publisher};
pub use relay::{Relay, RelayHandle};
