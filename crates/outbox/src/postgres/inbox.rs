//! The PostgreSQL inbox (see [`crate::backend::Inbox`] for the contract):
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool, event_id: uuid::Uuid) -> Result<(), outbox::Error> {
//! use outbox::{postgres::PgInbox, Inbox};
//! let inbox = PgInbox::default();
//! let mut tx = pool.begin().await.map_err(outbox::Error::Database)?;
//! if inbox.record(&mut tx, "inventory", event_id).await?.is_new() {
//!     // apply the business change with `&mut *tx` here
//! }
//! tx.commit().await.map_err(outbox::Error::Database)?; // ack the broker only after this
//! # Ok(()) }
//! ```

use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use crate::{backend::Inbox, error::Error, ident::Tables, inbox::Seen, sql::named};

const SQL: &str = include_str!("sql/inbox.sql");

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
            record_sql: tables.render(named(SQL, "record")),
            purge_sql: tables.render(named(SQL, "purge")),
        }
    }
}

impl Inbox for PgInbox {
    type Database = sqlx::Postgres;

    async fn record_message(
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

    /// Deletes rows older than `retention`, except those of events a consumer runner still
    /// holds (their row is the held event's claim on its id).
    async fn purge(&self, pool: &PgPool, retention: Duration, batch: i64) -> Result<u64, Error> {
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
