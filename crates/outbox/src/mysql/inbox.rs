//! The MySQL and MariaDB inbox.

use std::time::Duration;

use sqlx::{MySqlConnection, MySqlPool};

use crate::{backend::Inbox, error::Error, ident::Tables, inbox::Seen, sql::named};

const SQL: &str = include_str!("sql/inbox.sql");

/// The MySQL and MariaDB inbox (see [`Inbox`] for the contract).
#[derive(Clone, Debug)]
pub struct MySqlInbox {
    record_sql: String,
    purgeable_sql: String,
    delete_sql: String,
}

impl Default for MySqlInbox {
    fn default() -> Self {
        Self::new(&Tables::default())
    }
}

impl MySqlInbox {
    /// The inbox of the outbox in `tables`.
    pub fn new(tables: &Tables) -> Self {
        Self {
            record_sql: tables.render_mysql(named(SQL, "record")),
            purgeable_sql: tables.render_mysql(named(SQL, "purgeable")),
            delete_sql: tables.render_mysql(named(SQL, "delete")),
        }
    }
}

impl Inbox for MySqlInbox {
    type Database = sqlx::MySql;

    async fn record_message(
        &self,
        conn: &mut MySqlConnection,
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

    /// Deletes rows older than `retention`: the keys of a batch read without a lock, then each
    /// row by its primary key in one short transaction per batch.
    async fn purge(&self, pool: &MySqlPool, retention: Duration, batch: i64) -> Result<u64, Error> {
        let micros = i64::try_from(retention.as_micros()).unwrap_or(i64::MAX);
        let batch = batch.max(1);
        let mut total = 0;
        loop {
            let keys: Vec<(Vec<u8>, Vec<u8>)> = sqlx::query_as(&self.purgeable_sql)
                .bind(micros)
                .bind(batch)
                .fetch_all(pool)
                .await
                .map_err(Error::Database)?;
            if keys.is_empty() {
                return Ok(total);
            }
            // One short transaction per batch, each row by its primary key.
            let mut tx = pool.begin().await.map_err(Error::Database)?;
            for (consumer, event_id) in &keys {
                total += sqlx::query(&self.delete_sql)
                    .bind(consumer)
                    .bind(event_id)
                    .bind(micros)
                    .execute(&mut *tx)
                    .await
                    .map_err(Error::Database)?
                    .rows_affected();
            }
            tx.commit().await.map_err(Error::Database)?;
            if (keys.len() as i64) < batch {
                return Ok(total);
            }
        }
    }
}
