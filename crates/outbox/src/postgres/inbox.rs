//! The inbox: makes a consumer's effect happen once per event (guarantee G5).
//!
//! Delivery is at least once, so a consumer sees some events twice. Record the event id in the
//! same transaction as the business change; when the id was already there, skip the change:
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool, event_id: uuid::Uuid) -> Result<(), outbox::Error> {
//! use outbox::postgres::PgInbox;
//! let inbox = PgInbox::default();
//! let mut tx = pool.begin().await.map_err(outbox::Error::Database)?;
//! if inbox.record(&mut tx, "inventory", event_id).await?.is_new() {
//!     // apply the business change with `&mut *tx` here
//! }
//! tx.commit().await.map_err(outbox::Error::Database)?; // ack the broker only after this
//! # Ok(()) }
//! ```
//!
//! Retention: [`PgInbox::purge`] deletes rows older than a retention that must be longer than
//! any redelivery window (broker redelivery, relay retries after a crash, dead-letter replays):
//! a row purged before the last redelivery of its event lets that redelivery apply again.

use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use crate::{Error, Seen, Tables};

/// The inbox table of an outbox schema.
#[derive(Clone, Debug)]
pub struct PgInbox {
    record_sql: String,
    purge_sql: String,
}

impl Default for PgInbox {
    fn default() -> Self {
        Self::new(&Tables::default())
    }
}

impl PgInbox {
    /// The inbox in the schema of `tables` (created by the outbox migrations).
    pub fn new(tables: &Tables) -> Self {
        Self {
            record_sql: tables.render(
                "INSERT INTO {schema}.inbox (consumer, event_id, event_type) VALUES ($1, $2, $3) \
                 ON CONFLICT (consumer, event_id) DO NOTHING",
            ),
            // Rows of events a consumer still holds stay: their row is the held event's claim
            // on its id (`consumer_held`, created by migration 16 with the runners' tables).
            purge_sql: tables.render(
                "DELETE FROM {schema}.inbox WHERE ctid = ANY (ARRAY(\
                     SELECT i.ctid FROM {schema}.inbox i \
                     WHERE i.processed_at < now() - make_interval(secs => $1) \
                       AND NOT EXISTS (SELECT 1 FROM {schema}.consumer_held h \
                                       WHERE h.consumer = i.consumer AND h.message_id = i.event_id) \
                     LIMIT $2))",
            ),
        }
    }

    /// Records `event_id` for `consumer` inside the caller's transaction. Never commits.
    /// Concurrent deliveries of the same event wait on each other: exactly one sees `New`.
    pub async fn record(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<Seen, Error> {
        self.record_message(conn, consumer, &event_id.to_string(), None)
            .await
    }

    /// Records any text `message_id` for `consumer`, with the event type applied, inside the
    /// caller's transaction. For ids of producers that are not UUIDs (a CloudEvents `id`);
    /// a UUID is recorded as [`PgInbox::record`] does, in its lowercase hyphenated form, so
    /// pass that form. The id and type must be 1 to 255 characters, without NUL.
    pub async fn record_message(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: &str,
        event_type: Option<&str>,
    ) -> Result<Seen, Error> {
        crate::inbox::check_consumer(consumer)?;
        crate::inbox::check_message(message_id, event_type)?;
        let done = sqlx::query(&self.record_sql)
            .bind(consumer)
            .bind(message_id)
            .bind(event_type)
            .execute(conn)
            .await
            .map_err(Error::Database)?;
        Ok(crate::inbox::seen(done.rows_affected()))
    }

    /// Deletes rows older than `retention`, `batch` rows per statement (short locks, no long
    /// transaction), and returns how many were deleted.
    pub async fn purge(
        &self,
        pool: &sqlx::PgPool,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, Error> {
        crate::inbox::purge_in_batches(batch, |batch| async move {
            sqlx::query(&self.purge_sql)
                .bind(retention.as_secs_f64())
                .bind(batch)
                .execute(pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(Error::Database)
        })
        .await
    }
}
