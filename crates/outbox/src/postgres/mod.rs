//! PostgreSQL storage (sqlx): enqueue into the caller's transaction, and the schema migrations.

mod inbox;
mod migrate;
pub mod time_partitions;

use sqlx::{types::Json, PgConnection};
use uuid::Uuid;

pub use crate::Seen;
pub use inbox::PgInbox;
pub use migrate::{MigrateOptions, DEFAULT_PARTITIONS, MIGRATIONS};

use crate::{Error, Event, Tables, DEFAULT_MAX_PAYLOAD_BYTES};

const ENQUEUE_SQL: &str = include_str!("sql/enqueue.sql");

/// Writes events into a PostgreSQL outbox. Cheap to clone; holds no connection.
#[derive(Clone, Debug)]
pub struct PgOutbox {
    tables: Tables,
    max_payload_bytes: usize,
    notify: bool,
    enqueue_sql: String,
}

impl Default for PgOutbox {
    fn default() -> Self {
        Self::new(Tables::default())
    }
}

impl PgOutbox {
    /// An outbox in the given schema and table, with the defaults: payloads up to
    /// [`DEFAULT_MAX_PAYLOAD_BYTES`], and a NOTIFY on each enqueue so the relay wakes at commit.
    pub fn new(tables: Tables) -> Self {
        let enqueue_sql = tables.render(ENQUEUE_SQL);
        Self {
            tables,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            notify: true,
            enqueue_sql,
        }
    }

    /// Changes the largest payload accepted (bytes). Keep it at or below the broker's limit.
    pub fn max_payload_bytes(mut self, limit: usize) -> Self {
        self.max_payload_bytes = limit;
        self
    }

    /// Turns the wake-up NOTIFY off or on (default on). PostgreSQL serialises the commits of
    /// notifying transactions on one lock: writers at very high rates may prefer to let the
    /// relay find work by its fallback poll (see `bench/RESULTS.md` for the measured cost).
    pub fn notify(mut self, on: bool) -> Self {
        self.notify = on;
        self
    }

    /// Where this outbox lives.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// Creates or upgrades the outbox schema (idempotent, safe from several processes at once).
    pub async fn migrate(&self, pool: &sqlx::PgPool, options: MigrateOptions) -> Result<(), Error> {
        migrate::run(pool, &self.tables, options).await
    }

    /// Writes one event inside the caller's transaction and returns its id. Never commits and
    /// never opens a connection of its own: pass `&mut tx` (or any `PgConnection`).
    pub async fn enqueue(&self, conn: &mut PgConnection, event: &Event) -> Result<Uuid, Error> {
        self.enqueue_batch(conn, std::slice::from_ref(event))
            .await
            .map(|ids| ids[0])
    }

    /// Writes many events in one statement, in the given order, inside the caller's transaction.
    /// All are validated first; nothing is written if one is invalid.
    pub async fn enqueue_batch(
        &self,
        conn: &mut PgConnection,
        events: &[Event],
    ) -> Result<Vec<Uuid>, Error> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        for (i, event) in events.iter().enumerate() {
            event
                .validate(self.max_payload_bytes)
                .map_err(|e| match e {
                    Error::InvalidEvent { field, reason } if events.len() > 1 => {
                        Error::InvalidEvent {
                            field: format!("events[{i}].{field}"),
                            reason,
                        }
                    }
                    other => other,
                })?;
        }
        let columns = Columns::from(events);
        let channel = self.notify.then(|| self.tables.channel());
        sqlx::query(&self.enqueue_sql)
            .bind(&columns.event_id)
            .bind(&columns.aggregate_type)
            .bind(&columns.aggregate_id)
            .bind(&columns.aggregate_version)
            .bind(&columns.event_type)
            .bind(&columns.schema_version)
            .bind(&columns.destination)
            .bind(&columns.payload)
            .bind(&columns.content_type)
            .bind(&columns.headers)
            .bind(&columns.occurred_at)
            .bind(channel)
            .execute(&mut *conn)
            .await
            .map_err(|e| self.map_insert_error(e, events))?;
        Ok(columns.event_id)
    }

    fn map_insert_error(&self, error: sqlx::Error, events: &[Event]) -> Error {
        let constraint = error
            .as_database_error()
            .and_then(|e| e.constraint())
            .map(str::to_owned);
        let version_key = format!("{}_aggregate_version_key", self.tables.events().as_str());
        if constraint.as_deref() == Some(version_key.as_str()) {
            // Name the conflicting event when there is one candidate; otherwise the first
            // versioned one (PostgreSQL's detail message carries the exact key).
            if let Some(e) = events.iter().find(|e| e.aggregate_version.is_some()) {
                return Error::DuplicateAggregateVersion {
                    aggregate_type: e.aggregate_type.clone(),
                    aggregate_id: e.aggregate_id.clone(),
                    version: e.aggregate_version.unwrap_or_default(),
                };
            }
        }
        if let Some(db) = error.as_database_error() {
            if db.code().as_deref() == Some("42P01") {
                return Error::Schema(crate::SchemaError::Missing);
            }
        }
        Error::Database(error)
    }
}

/// The events as one array per column, for `unnest`.
struct Columns {
    event_id: Vec<Uuid>,
    aggregate_type: Vec<String>,
    aggregate_id: Vec<String>,
    aggregate_version: Vec<Option<i64>>,
    event_type: Vec<String>,
    schema_version: Vec<i32>,
    destination: Vec<Option<String>>,
    payload: Vec<Vec<u8>>,
    content_type: Vec<String>,
    headers: Vec<Json<crate::Headers>>,
    occurred_at: Vec<Option<chrono::DateTime<chrono::Utc>>>,
}

impl From<&[Event]> for Columns {
    fn from(events: &[Event]) -> Self {
        Self {
            event_id: events.iter().map(|e| e.event_id).collect(),
            aggregate_type: events.iter().map(|e| e.aggregate_type.clone()).collect(),
            aggregate_id: events.iter().map(|e| e.aggregate_id.clone()).collect(),
            aggregate_version: events.iter().map(|e| e.aggregate_version).collect(),
            event_type: events.iter().map(|e| e.event_type.clone()).collect(),
            schema_version: events.iter().map(|e| e.schema_version).collect(),
            destination: events.iter().map(|e| e.destination.clone()).collect(),
            payload: events.iter().map(|e| e.payload.clone()).collect(),
            content_type: events.iter().map(|e| e.content_type.clone()).collect(),
            headers: events.iter().map(|e| Json(e.headers.clone())).collect(),
            occurred_at: events.iter().map(|e| e.occurred_at).collect(),
        }
    }
}
