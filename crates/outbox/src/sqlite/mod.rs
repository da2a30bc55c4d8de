//! SQLite storage (sqlx): the embedded default. The same contract as PostgreSQL's, in tables
//! named `{schema}_events`, `{schema}_inbox`, … (SQLite has no schemas). One relay at a time.

use std::time::Duration;

use sqlx::{Executor, SqliteConnection, SqlitePool};
use uuid::Uuid;

use crate::{event::validate_all, Error, Event, Seen, Tables, DEFAULT_MAX_PAYLOAD_BYTES};

/// The migrations this build ships for SQLite.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "create outbox and inbox",
        include_str!("migrations/0001_create_outbox.sql"),
    ),
    (
        2,
        "pending rows by aggregate",
        include_str!("migrations/0002_pending_aggregate_index.sql"),
    ),
    (
        3,
        "permanent failures counted apart",
        include_str!("migrations/0003_permanent_failures.sql"),
    ),
    (
        4,
        "waiting rows out of the claim's index",
        include_str!("migrations/0004_waiting_rows.sql"),
    ),
    (
        5,
        "purge index, audit and archive",
        include_str!("migrations/0005_operations.sql"),
    ),
    (
        6,
        "inbox: event types",
        include_str!("migrations/0006_inbox_event_type.sql"),
    ),
    (
        7,
        "arrival time by the database clock",
        include_str!("migrations/0007_enqueued_at.sql"),
    ),
];

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
        let insert_sql = tables.render_sqlite(
            "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, aggregate_version, \
             event_type, schema_version, destination, payload, content_type, headers, occurred_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, \
                     COALESCE(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))",
        );
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

    /// Where this outbox lives.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// Creates or upgrades the tables (idempotent; concurrent callers serialise on SQLite's
    /// write lock).
    pub async fn migrate(&self, pool: &SqlitePool) -> Result<(), Error> {
        // A transaction sqlx tracks: rolled back if this future is dropped half-way, rather
        // than left open on a pooled connection, holding the write lock.
        let mut tx = pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(Error::Database)?;
        let result = migrate_locked(&mut tx, &self.tables).await;
        match result {
            Ok(()) => tx.commit().await.map_err(Error::Database),
            Err(error) => {
                let _ = tx.rollback().await;
                Err(error)
            }
        }
    }

    /// What [`migrate`](Self::migrate) would apply, as one SQL script for teams that apply
    /// schema changes with their own tools (`sqlite3 FILE < SCRIPT`; its first line is
    /// sqlite3's `.bail on`, to drop for another tool that stops at errors): the migrations in one
    /// `BEGIN IMMEDIATE` transaction, each followed by its bookkeeping row. With `pool`, only
    /// what the database lacks (read, nothing written), with the views and triggers that name
    /// the events table set aside around its rebuild as `migrate` does; without, every
    /// migration, for a new outbox.
    pub async fn migration_script(&self, pool: Option<&SqlitePool>) -> Result<String, Error> {
        let tables = &self.tables;
        let mut conn = match pool {
            Some(pool) => Some(pool.acquire().await.map_err(Error::Database)?),
            None => None,
        };
        let applied = match conn.as_deref_mut() {
            Some(conn) => applied(conn, tables).await?,
            None => Vec::new(),
        };
        let due = crate::migration::due(&applied, MIGRATIONS)?;
        let mut script =
            crate::migration_script::Script::new("SQLite", &tables.render_sqlite("{events}"));
        if due.is_empty() {
            return Ok(script.finish());
        }
        script.comment(
            "For sqlite3: stop at the first error. Without it the shell goes on and the last \
             COMMIT\nwould keep what had succeeded (a rebuild without its table's rename, \
             recorded as done).",
        );
        script.client_command(".bail on");
        script.comment(
            "One transaction, holding the database's write lock as `outbox migrate` does.",
        );
        script.statement("BEGIN IMMEDIATE");
        script.statement(&tables.render_sqlite(BOOTSTRAP));
        for (version, description, template) in due {
            script.migration(*version, description);
            let dependents = match (*version == REBUILDS_EVENTS, conn.as_deref_mut()) {
                (true, Some(conn)) => dependents(conn, tables).await?,
                (true, None) => {
                    script.comment(
                        "It rebuilds the events table: drop the views and triggers that name it \
                         before,\nand create them again after (printed with a database, the \
                         script does it).",
                    );
                    Vec::new()
                }
                _ => Vec::new(),
            };
            for dependent in dependents.iter().rev() {
                script.statement(&dependent.drop());
            }
            script.statement(&tables.render_sqlite(template));
            for dependent in &dependents {
                script.statement(&dependent.sql);
            }
            script.statement(&format!(
                "{} ({version}, {}, {})",
                tables.render_sqlite(RECORD),
                crate::migration_script::literal(description),
                crate::migration_script::literal(&crate::migration::checksum(template))
            ));
        }
        script.statement("COMMIT");
        Ok(script.finish())
    }

    /// Writes one event inside the caller's transaction and returns its id. Never commits.
    pub async fn enqueue(&self, conn: &mut SqliteConnection, event: &Event) -> Result<Uuid, Error> {
        self.enqueue_batch(conn, std::slice::from_ref(event))
            .await
            .map(|ids| ids[0])
    }

    /// Writes typed `event` of aggregate `aggregate_id` inside the caller's transaction and
    /// returns its id: [`Event::of`] then [`enqueue`](Self::enqueue). Never commits.
    pub async fn publish<E: crate::DomainEvent + ?Sized>(
        &self,
        conn: &mut SqliteConnection,
        aggregate_id: impl std::fmt::Display,
        event: &E,
    ) -> Result<Uuid, Error> {
        let event = Event::of(aggregate_id, event)?;
        self.enqueue(conn, &event).await
    }

    /// Writes many events, in order, inside the caller's transaction. All are validated first;
    /// nothing is written if one is invalid.
    pub async fn enqueue_batch(
        &self,
        conn: &mut SqliteConnection,
        events: &[Event],
    ) -> Result<Vec<Uuid>, Error> {
        validate_all(events, self.max_payload_bytes)?;
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

async fn migrate_locked(conn: &mut SqliteConnection, tables: &Tables) -> Result<(), Error> {
    migrate_with(conn, tables, MIGRATIONS).await
}

/// The bookkeeping table every run starts with.
const BOOTSTRAP: &str = "CREATE TABLE IF NOT EXISTS {migrations} (
    version     INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    checksum    TEXT NOT NULL,
    applied_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))";

/// The bookkeeping row of an applied migration, up to its values.
const RECORD: &str = "INSERT INTO {migrations} (version, description, checksum) VALUES";

/// The migrations the database records (version, checksum); none when the bookkeeping table
/// does not exist. Reads only.
async fn applied(
    conn: &mut SqliteConnection,
    tables: &Tables,
) -> Result<Vec<(i32, String)>, Error> {
    let exists: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1")
            .bind(tables.render_sqlite("{migrations}"))
            .fetch_one(&mut *conn)
            .await
            .map_err(Error::Database)?;
    if exists == 0 {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        &tables.render_sqlite("SELECT version, checksum FROM {migrations} ORDER BY version"),
    )
    .fetch_all(conn)
    .await
    .map_err(Error::Database)
}

/// Applies the migrations of `shipped` not yet applied.
async fn migrate_with(
    conn: &mut SqliteConnection,
    tables: &Tables,
    shipped: &'static [crate::migration::Migration],
) -> Result<(), Error> {
    conn.execute(sqlx::raw_sql(&tables.render_sqlite(BOOTSTRAP)))
        .await
        .map_err(Error::Database)?;
    let applied = applied(conn, tables).await?;
    for (version, description, template) in crate::migration::due(&applied, shipped)? {
        // The rebuild drops the events table: the users' triggers on it and views of it are
        // set aside and made again after (SQLite refuses the rename while a view names it).
        let dependents = if *version == REBUILDS_EVENTS {
            dependents(conn, tables).await?
        } else {
            Vec::new()
        };
        for dependent in dependents.iter().rev() {
            conn.execute(sqlx::raw_sql(&dependent.drop()))
                .await
                .map_err(Error::Database)?;
        }
        conn.execute(sqlx::raw_sql(&tables.render_sqlite(template)))
            .await
            .map_err(Error::Database)?;
        for dependent in &dependents {
            conn.execute(sqlx::raw_sql(&dependent.sql))
                .await
                .map_err(Error::Database)?;
        }
        sqlx::query(&format!("{} (?, ?, ?)", tables.render_sqlite(RECORD)))
            .bind(version)
            .bind(description)
            .bind(crate::migration::checksum(template))
            .execute(&mut *conn)
            .await
            .map_err(Error::Database)?;
    }
    Ok(())
}

/// The migration that rebuilds the events table (to add a column with a computed default).
const REBUILDS_EVENTS: i32 = 7;

/// A view or trigger of the database that names the events table (a user's audit trigger, a
/// reporting view), set aside while the table is rebuilt.
struct Dependent {
    kind: String,
    name: String,
    /// The statement that makes it.
    sql: String,
}

impl Dependent {
    /// The statement that drops it.
    fn drop(&self) -> String {
        format!(
            "DROP {} \"{}\"",
            self.kind.to_uppercase(),
            self.name.replace('"', "\"\"")
        )
    }
}

/// The views and triggers of the database that name the events table, views first (the order
/// that makes them again). Reads only.
async fn dependents(conn: &mut SqliteConnection, tables: &Tables) -> Result<Vec<Dependent>, Error> {
    let events = tables.render_sqlite("{events}");
    let found: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT type, name, sql FROM sqlite_master
         WHERE type IN ('view', 'trigger') AND sql IS NOT NULL
           AND (tbl_name = ?1 OR instr(lower(sql), lower(?1)) > 0)
         ORDER BY type = 'trigger', rowid",
    )
    .bind(&events)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::Database)?;
    Ok(found
        .into_iter()
        .map(|(kind, name, sql)| Dependent { kind, name, sql })
        .collect())
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
        return Error::Schema(crate::SchemaError::Missing);
    }
    Error::Database(error)
}

/// The SQLite inbox (see [`crate::postgres::PgInbox`] for the contract).
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
            record_sql: tables.render_sqlite(
                "INSERT INTO {inbox} (consumer, event_id, event_type) VALUES (?, ?, ?) \
                 ON CONFLICT (consumer, event_id) DO NOTHING",
            ),
            purge_sql: tables.render_sqlite(
                "DELETE FROM {inbox} WHERE rowid IN (SELECT rowid FROM {inbox} \
                 WHERE processed_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?) LIMIT ?)",
            ),
        }
    }

    /// Records `event_id` for `consumer` inside the caller's transaction. Never commits.
    pub async fn record(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<Seen, Error> {
        self.record_message(conn, consumer, &event_id.to_string(), None)
            .await
    }

    /// Records any text `message_id` and the event type for `consumer` (see
    /// [`crate::postgres::PgInbox::record_message`]).
    pub async fn record_message(
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

    /// Deletes rows older than `retention`, `batch` rows per statement.
    pub async fn purge(
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

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod upgrade_tests;
