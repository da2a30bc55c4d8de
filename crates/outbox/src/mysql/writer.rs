//! The MySQL and MariaDB writer: one insert per event, into the caller's transaction.

use sqlx::{Executor, MySqlConnection, MySqlPool};
use uuid::Uuid;

use super::{error_number, migrate, MySqlInbox};
use crate::{
    backend::Outbox,
    error::{Error, SchemaError},
    event::{validate_all, Event, DEFAULT_MAX_PAYLOAD_BYTES},
    ident::Tables,
    migration::MigrateOptions,
    sql::{named, savepoint},
};

const SQL: &str = include_str!("sql/writer.sql");

/// Writes events into a MySQL or MariaDB outbox. Cheap to clone; holds no connection.
#[derive(Clone, Debug)]
pub struct MySqlOutbox {
    tables: Tables,
    max_payload_bytes: usize,
    insert_sql: String,
}

impl Default for MySqlOutbox {
    fn default() -> Self {
        Self::new(Tables::default())
    }
}

impl MySqlOutbox {
    /// An outbox whose tables are prefixed with `tables.schema()`.
    pub fn new(tables: Tables) -> Self {
        let insert_sql = tables.render_mysql(named(SQL, "insert"));
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

impl Outbox for MySqlOutbox {
    type Database = sqlx::MySql;
    type Inbox = MySqlInbox;

    fn tables(&self) -> &Tables {
        &self.tables
    }

    fn inbox(&self) -> MySqlInbox {
        MySqlInbox::new(&self.tables)
    }

    /// Creates or upgrades the tables. Concurrent migrators queue on a named lock
    /// (`GET_LOCK`), then find the work done. MySQL commits DDL statement by statement, so
    /// every statement can run again: a migration cut short completes on the next run.
    /// `options.partitions` is the partition count of a new outbox (default 32); time
    /// partitioning is PostgreSQL's only.
    async fn migrate(&self, pool: &MySqlPool, options: MigrateOptions) -> Result<(), Error> {
        migrate::run(pool, &self.tables, options).await
    }

    /// What [`migrate`](Self::migrate) would apply, as one SQL script for teams whose DBAs
    /// apply schema changes with their own tools (`mysql --database=DB < FILE`): the
    /// migrations' statements under the named lock `migrate` takes, each migration followed by
    /// its bookkeeping row, then the lease rows. With `pool`, only what the database lacks
    /// (read, nothing written; `options` checked against the existing outbox); without, every
    /// migration, for a new outbox.
    async fn migration_script(
        &self,
        pool: Option<&MySqlPool>,
        options: MigrateOptions,
    ) -> Result<String, Error> {
        migrate::script(pool, &self.tables, options).await
    }

    /// Writes the events one statement each, in order, inside a savepoint when there are
    /// several: a duplicate version refused half-way leaves none of them.
    async fn enqueue_batch(
        &self,
        conn: &mut MySqlConnection,
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

impl MySqlOutbox {
    /// Inserts the events one statement each, in order.
    async fn insert(
        &self,
        conn: &mut MySqlConnection,
        events: &[Event],
    ) -> Result<Vec<Uuid>, Error> {
        let mut ids = Vec::with_capacity(events.len());
        for e in events {
            sqlx::query(&self.insert_sql)
                .bind(e.event_id.hyphenated().to_string())
                .bind(&e.aggregate_type)
                .bind(&e.aggregate_id)
                .bind(e.aggregate_version)
                .bind(&e.event_type)
                .bind(e.schema_version)
                .bind(&e.destination)
                .bind(&e.payload)
                .bind(&e.content_type)
                .bind(serde_json::to_string(&e.stored_headers()).map_err(Error::Serialize)?)
                .bind(e.occurred_at.map(|t| t.naive_utc()))
                .execute(&mut *conn)
                .await
                .map_err(|err| map_insert_error(err, e))?;
            ids.push(e.event_id);
        }
        Ok(ids)
    }
}

fn map_insert_error(error: sqlx::Error, event: &Event) -> Error {
    let code = error_number(&error);
    let message = error
        .as_database_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    match code {
        // ER_DUP_ENTRY on the (aggregate, version) key.
        Some(1062) if message.contains("aggregate_version_key") => {
            Error::DuplicateAggregateVersion {
                aggregate_type: event.aggregate_type.clone(),
                aggregate_id: event.aggregate_id.clone(),
                version: event.aggregate_version.unwrap_or_default(),
            }
        }
        // ER_NO_SUCH_TABLE.
        Some(1146) => Error::Schema(SchemaError::Missing),
        _ => Error::Database(error),
    }
}
