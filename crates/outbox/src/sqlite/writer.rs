//! The SQLite writer: one insert per event, into the caller's transaction.

use sqlx::{Executor, SqliteConnection, SqlitePool};
use uuid::Uuid;

use super::{migrate, SqliteInbox};
use crate::{
    event::validate_all,
    sql::{named, savepoint},
    Error, Event, MigrateOptions, Outbox, Tables, DEFAULT_MAX_PAYLOAD_BYTES,
};

const SQL: &str = include_str!("sql/writer.sql");

/// Writes events into a SQLite outbox. Cheap to clone; holds no connection.
#[derive(Clone, Debug)]
pub struct SqliteOutbox {
    tables: Tables,
    max_payload_bytes: usize,
    insert_sql: String,
}

impl Default for SqliteOutbox {
    fn default() -> Self {
        Self::new(Tables::default())
    }
}

impl SqliteOutbox {
    /// An outbox whose tables are prefixed with `tables.schema()`.
    pub fn new(tables: Tables) -> Self {
        let insert_sql = tables.render_sqlite(named(SQL, "insert"));
        Self {
            tables,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            insert_sql,
        }
    }

    /// Changes the largest payload accepted (bytes).
    pub fn max_payload_bytes(mut self, limit: usize) -> Self {
        self.max_payload_bytes = limit;
        self
    }
}

impl Outbox for SqliteOutbox {
    type Database = sqlx::Sqlite;
    type Inbox = SqliteInbox;

    fn tables(&self) -> &Tables {
        &self.tables
    }

    fn inbox(&self) -> SqliteInbox {
        SqliteInbox::new(&self.tables)
    }

    /// Creates or upgrades the tables (idempotent; concurrent callers serialise on SQLite's
    /// write lock).
    async fn migrate(&self, pool: &SqlitePool, options: MigrateOptions) -> Result<(), Error> {
        migrate::run(pool, &self.tables, options).await
    }

    /// What [`migrate`](Self::migrate) would apply, as one SQL script for teams that apply
    /// schema changes with their own tools (`sqlite3 FILE < SCRIPT`; its first line is
    /// sqlite3's `.bail on`, to drop for another tool that stops at errors): the migrations in one
    /// `BEGIN IMMEDIATE` transaction, each followed by its bookkeeping row. With `pool`, only
    /// what the database lacks (read, nothing written), with the views and triggers that name
    /// the events table set aside around its rebuild as `migrate` does; without, every
    /// migration, for a new outbox.
    async fn migration_script(
        &self,
        pool: Option<&SqlitePool>,
        options: MigrateOptions,
    ) -> Result<String, Error> {
        migrate::script(pool, &self.tables, options).await
    }

    /// Writes the events one statement each, in order, inside a savepoint when there are
    /// several: a duplicate version refused half-way leaves none of them.
    async fn enqueue_batch(
        &self,
        conn: &mut SqliteConnection,
        events: &[Event],
    ) -> Result<Vec<Uuid>, Error> {
        validate_all(events, self.max_payload_bytes)?;
        if events.len() == 1 {
            return self.insert(conn, events).await;
        }
        conn.execute(savepoint::OPEN)
            .await
            .map_err(Error::Database)?;
        match self.insert(&mut *conn, events).await {
            Ok(ids) => {
                conn.execute(savepoint::RELEASE)
                    .await
                    .map_err(Error::Database)?;
                Ok(ids)
            }
            Err(error) => {
                // The batch's error is the one to report; a savepoint that cannot be rolled
                // back (MySQL outside a transaction has none) leaves the connection as it is.
                if conn.execute(savepoint::ROLL_BACK).await.is_ok() {
                    let _ = conn.execute(savepoint::RELEASE).await;
                }
                Err(error)
            }
        }
    }
}

impl SqliteOutbox {
    /// Inserts the events one statement each, in order.
    async fn insert(
        &self,
        conn: &mut SqliteConnection,
        events: &[Event],
    ) -> Result<Vec<Uuid>, Error> {
        let mut ids = Vec::with_capacity(events.len());
        for e in events {
            sqlx::query(&self.insert_sql)
                .bind(e.event_id.to_string())
                .bind(&e.aggregate_type)
                .bind(&e.aggregate_id)
                .bind(e.aggregate_version)
                .bind(&e.event_type)
                .bind(e.schema_version)
                .bind(&e.destination)
                .bind(&e.payload)
                .bind(&e.content_type)
                .bind(serde_json::to_string(&e.stored_headers()).map_err(Error::Serialize)?)
                .bind(
                    e.occurred_at
                        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()),
                )
                .execute(&mut *conn)
                .await
                .map_err(|err| map_insert_error(err, e))?;
            ids.push(e.event_id);
        }
        Ok(ids)
    }
}

fn map_insert_error(error: sqlx::Error, event: &Event) -> Error {
    let message = error
        .as_database_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    if message.contains("UNIQUE constraint failed") && message.contains("aggregate_version") {
        return Error::DuplicateAggregateVersion {
            aggregate_type: event.aggregate_type.clone(),
            aggregate_id: event.aggregate_id.clone(),
            version: event.aggregate_version.unwrap_or_default(),
        };
    }
    if message.contains("no such table") {
        return Error::Schema(crate::error::SchemaError::Missing);
    }
    Error::Database(error)
}
