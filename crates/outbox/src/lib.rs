//! # outbox
//!
//! The write side of the transactional outbox. A service that must change its database *and* tell
//! the rest of the system writes the event as one more row, inside the transaction that already
//! holds the business change. If the transaction commits, the event is durable with it; if it
//! rolls back, the event never existed. The relay (`outbox relay`, crate `outbox-relayer`) publishes
//! committed rows to the broker afterwards, at least once and in order per aggregate.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox::{postgres::PgOutbox, DomainEvent, Outbox};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct OrderPlaced {
//!     order_id: i64,
//!     total: String,
//! }
//!
//! impl DomainEvent for OrderPlaced {
//!     const AGGREGATE_TYPE: &'static str = "order";
//!     const EVENT_TYPE: &'static str = "OrderPlaced";
//! }
//!
//! let outbox = PgOutbox::default();
//! outbox.migrate(&pool, Default::default()).await?; // once, at start-up or from `outbox migrate`
//!
//! let mut tx = pool.begin().await?;
//! sqlx::query("UPDATE orders SET status = 'placed' WHERE id = $1")
//!     .bind(42_i64)
//!     .execute(&mut *tx)
//!     .await?;
//! let placed = OrderPlaced { order_id: 42, total: "19.90".into() };
//! outbox.publish(&mut tx, 42, &placed).await?;
//! tx.commit().await?; // the event is published only if this commit succeeds
//! # Ok(()) }
//! ```
//!
//! [`Event`] is the untyped form, for what a [`DomainEvent`] does not set (aggregate version,
//! headers, destination, opaque payloads): `Event::of(42, &placed)?.aggregate_version(3)` or
//! `Event::new("order", "42", "OrderPlaced").json(&value)?`, written with `enqueue`.
//!
//! The outbox table is a public contract: services in any language may `INSERT` into it directly
//! (see the crate README, or docs/architecture.md in the repository: the write contract).

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod backend;
pub mod backoff;
pub mod compat;
mod error;
mod event;
mod headers;
mod ident;
mod inbox;
mod migration;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod migration_script;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod typed;
pub mod wal;
pub mod wire;

/// The README's examples, compiled as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use backend::{Connection, Inbox, Outbox};
pub use error::{chain as error_chain, Error, SchemaError};
pub use event::{Event, DEFAULT_CONTENT_TYPE, DEFAULT_MAX_PAYLOAD_BYTES};
pub use headers::Headers;
pub use ident::{Ident, Tables};
pub use inbox::{check_message as check_inbox_message, Seen, MAX_MESSAGE_ID_CHARS};
pub use migration::{require_migrated, MigrateOptions, DEFAULT_PARTITIONS};
pub use typed::DomainEvent;
