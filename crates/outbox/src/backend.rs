//! The seams every storage backend implements: the writer ([`Outbox`]) and the inbox
//! ([`Inbox`]). PostgreSQL, MySQL/MariaDB and SQLite each implement both in their own folder;
//! code written against the traits runs on any of them, and one conformance suite
//! (`tests/conformance.rs`) holds each to the same contract.

use std::{fmt::Display, future::Future, time::Duration};

use sqlx::{Database, Pool};
use uuid::Uuid;

use crate::{
    error::Error, event::Event, ident::Tables, inbox::Seen, migration::MigrateOptions,
    typed::DomainEvent,
};

/// The connection of a backend's database: what `&mut tx` of an open sqlx transaction derefs
/// to, and what every write below takes, so that it happens inside the caller's transaction.
pub type Connection<O> = <<O as Outbox>::Database as Database>::Connection;

/// Writes events into an outbox, inside the caller's own transaction: the write commits or
/// rolls back with the business change (guarantee G1). Never commits and never opens a
/// connection of its own. Cheap to clone; holds no connection.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox::{sqlite::SqliteOutbox, Event, Outbox};
///
/// let outbox = SqliteOutbox::default();
/// outbox.migrate(&pool, Default::default()).await?;
/// let mut tx = pool.begin().await?;
/// outbox.enqueue(&mut tx, &Event::new("order", "42", "OrderPlaced")).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub trait Outbox: Clone + Send + Sync + 'static {
    /// The sqlx database this outbox lives in.
    type Database: Database;
    /// The inbox of the same outbox (same schema or table prefix).
    type Inbox: Inbox<Database = Self::Database>;

    /// Where this outbox lives.
    fn tables(&self) -> &Tables;

    /// The inbox beside this outbox's events table.
    fn inbox(&self) -> Self::Inbox;

    /// Creates or upgrades the outbox's tables: idempotent, and safe from several processes at
    /// once (they queue on the backend's migration lock, then find the work done). `options`
    /// are checked against what the backend supports (partitions and time partitioning are
    /// not everyone's) and, on an existing outbox, against what it was created with.
    fn migrate(
        &self,
        pool: &Pool<Self::Database>,
        options: MigrateOptions,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// What [`migrate`](Self::migrate) would apply, as one SQL script for teams whose DBAs
    /// apply schema changes with their own tools. With `pool`, only what the database lacks
    /// (read, nothing written); without, every migration, for a new outbox.
    fn migration_script(
        &self,
        pool: Option<&Pool<Self::Database>>,
        options: MigrateOptions,
    ) -> impl Future<Output = Result<String, Error>> + Send;

    /// Writes many events, in the given order, inside the caller's transaction, and returns
    /// their ids. All or nothing: all are validated first, and when the database refuses one
    /// (a duplicate aggregate version) none of the batch is written.
    fn enqueue_batch(
        &self,
        conn: &mut Connection<Self>,
        events: &[Event],
    ) -> impl Future<Output = Result<Vec<Uuid>, Error>> + Send;

    /// Writes one event inside the caller's transaction and returns its id: pass `&mut tx`.
    fn enqueue(
        &self,
        conn: &mut Connection<Self>,
        event: &Event,
    ) -> impl Future<Output = Result<Uuid, Error>> + Send {
        let batch = self.enqueue_batch(conn, std::slice::from_ref(event));
        async move { batch.await.map(|ids| ids[0]) }
    }

    /// Writes typed `event` of aggregate `aggregate_id` inside the caller's transaction and
    /// returns its id: [`Event::of`] then [`enqueue`](Self::enqueue).
    fn publish<E: DomainEvent + ?Sized>(
        &self,
        conn: &mut Connection<Self>,
        aggregate_id: impl Display,
        event: &E,
    ) -> impl Future<Output = Result<Uuid, Error>> + Send {
        let event = Event::of(aggregate_id, event);
        async move { self.enqueue(conn, &event?).await }
    }
}

/// Makes a consumer's effect happen once per event (guarantee G5): record the event's id in the
/// same transaction as the effect, and skip the effect when the id was already there.
///
/// Retention: [`purge`](Self::purge) deletes rows older than a retention that must be longer
/// than any redelivery window (broker redelivery, relay retries after a crash, dead-letter
/// replays): a row purged before the last redelivery of its event lets that redelivery apply
/// again.
pub trait Inbox: Clone + Send + Sync + 'static {
    /// The sqlx database this inbox lives in.
    type Database: Database;

    /// Records any text `message_id` for `consumer`, with the event type applied, inside the
    /// caller's transaction: [`Seen::New`] the first time, [`Seen::Duplicate`] after. For ids
    /// of producers that are not UUIDs (a CloudEvents `id`); a UUID is recorded as
    /// [`record`](Self::record) does, in its lowercase hyphenated form, so pass that form.
    /// The consumer, the id and the type must be 1 to 255 characters, without NUL. Concurrent deliveries of the same event wait on each other: exactly one sees
    /// `New`.
    fn record_message(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        consumer: &str,
        message_id: &str,
        event_type: Option<&str>,
    ) -> impl Future<Output = Result<Seen, Error>> + Send;

    /// Records `event_id` for `consumer` inside the caller's transaction.
    fn record(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        consumer: &str,
        event_id: Uuid,
    ) -> impl Future<Output = Result<Seen, Error>> + Send {
        async move {
            self.record_message(conn, consumer, &event_id.to_string(), None)
                .await
        }
    }

    /// Deletes rows older than `retention`, `batch` rows per statement (short locks, no long
    /// transaction), and returns how many were deleted.
    fn purge(
        &self,
        pool: &Pool<Self::Database>,
        retention: Duration,
        batch: i64,
    ) -> impl Future<Output = Result<u64, Error>> + Send;
}
