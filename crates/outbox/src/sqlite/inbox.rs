//! The SQLite inbox.

use std::time::Duration;

use sqlx::{SqliteConnection, SqlitePool};

use crate::{backend::Inbox, error::Error, ident::Tables, inbox::Seen, sql::named};

const SQL: &str = include_str!("sql/inbox.sql");

/// The SQLite inbox (see [`Inbox`] for the contract).
#[derive(Clone, Debug)]
pub struct SqliteInbox {
    record_sql: String,
    purge_sql: String,
}

impl Default for SqliteInbox {
    fn default() -> Self {
        Self::new(&Tables::default())
    }
}

impl SqliteInbox {
    /// The inbox of the outbox in `tables`.
    pub fn new(tables: &Tables) -> Self {
        Self {
            record_sql: tables.render_sqlite(named(SQL, "record")),
            purge_sql: tables.render_sqlite(named(SQL, "purge")),
        }
    }
}

impl Inbox for SqliteInbox {
    type Database = sqlx::Sqlite;

    async fn record_message(
        &self,
        conn: &mut SqliteConnection,
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

    async fn purge(
        &self,
        pool: &SqlitePool,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, Error> {
        let modifier = format!("-{} seconds", retention.as_secs());
        crate::inbox::purge_in_batches(batch, |batch| {
            let modifier = &modifier;
            async move {
                sqlx::query(&self.purge_sql)
                    .bind(modifier)
                    .bind(batch)
                    .execute(pool)
                    .await
                    .map(|done| done.rows_affected())
                    .map_err(Error::Database)
            }
        })
        .await
    }
}
