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
//! use outbox::{postgres::PgOutbox, Event};
//!
//! let outbox = PgOutbox::new(Default::default());
//! outbox.migrate(&pool, Default::default()).await?; // once, at start-up or from `outbox migrate`
//!
//! let mut tx = pool.begin().await?;
//! sqlx::query("UPDATE orders SET status = 'placed' WHERE id = $1")
//!     .bind(42_i64)
//!     .execute(&mut *tx)
//!     .await?;
//! let event = Event::new("order", "42", "OrderPlaced")
//!     .json(&serde_json::json!({ "order_id": 42, "total": "19.90" }))?
//!     .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
//! let event_id = outbox.enqueue(&mut tx, &event).await?;
//! tx.commit().await?; // the event is published only if this commit succeeds
//! # let _ = event_id; Ok(()) }
//! ```
//!
//! The outbox table is a public contract: services in any language may `INSERT` into it directly
//! (see the README for the plain-SQL form).

pub mod compat;
mod error;
mod event;
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
pub mod wal;
pub mod wire;

pub use error::{Error, SchemaError};
pub use event::{Event, Headers, DEFAULT_CONTENT_TYPE, DEFAULT_MAX_PAYLOAD_BYTES};
pub use ident::{Ident, Tables};
pub use inbox::{check_message as check_inbox_message, Seen, MAX_MESSAGE_ID_CHARS};
pub use migration::{require_migrated, MigrateOptions, DEFAULT_PARTITIONS};
