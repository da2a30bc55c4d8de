//! The PostgreSQL writer: events into the caller's transaction, as table rows, as rows the
//! table does not keep, or as WAL messages only.

use sqlx::{types::Json, PgConnection, PgPool};
use uuid::Uuid;

use crate::{
    backend::Outbox,
    error::Error,
    event::{Event, DEFAULT_MAX_PAYLOAD_BYTES},
    ident::Tables,
    migration::MigrateOptions,
    sql::named,
};

use super::PgInbox;

const SQL: &str = include_str!("sql/writer.sql");

/// How [`PgOutbox`] writes an event. The table is the default and works with every relay
/// mode; the other two need the CDC relay (`outbox relay --mode cdc`), which publishes from
/// the WAL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteMode {
    /// A row in the events table (default). The relay marks it published; a purge job deletes
    /// it after the retention.
    #[default]
    Table,
    /// A row inserted and deleted again in the same transaction: the insert reaches the WAL,
    /// the CDC relay publishes it from there, and the table stays empty (no purge, no bloat
    /// from published rows). The unique `event_id` and `aggregate_version` checks run at
    /// insert, but only against rows still there: those of the same transaction and of
    /// concurrent ones (a version reused after its row was deleted is not caught). Dead
    /// letters are written back into the table by the relay. Without a live slot (none
    /// created, or lost) the row is kept, as in [`WriteMode::Table`]: nothing is deleted that
    /// no stream will carry.
    ZeroGrowth,
    /// No table at all: a transactional logical decoding message per event
    /// (`pg_logical_emit_message`, see [`crate::wal`]). The cheapest write; but nothing
    /// checks `aggregate_version` uniqueness, and only the CDC relay can publish it. Without a
    /// live slot (none created, or lost) the events are written as table rows instead: a
    /// message no slot decodes would be lost.
    WalOnly,
}

/// Writes events into a PostgreSQL outbox. Cheap to clone; holds no connection.
#[derive(Clone, Debug)]
pub struct PgOutbox {
    tables: Tables,
    max_payload_bytes: usize,
    notify: bool,
    mode: WriteMode,
    enqueue_sql: String,
    zero_growth_sql: String,
    emit_sql: String,
    prefix: String,
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
        Self {
            enqueue_sql: tables.render(named(SQL, "enqueue")),
            zero_growth_sql: tables.render(named(SQL, "zero_growth")),
            emit_sql: tables.render(named(SQL, "emit")),
            prefix: crate::wal::prefix(&tables),
            tables,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            notify: true,
            mode: WriteMode::Table,
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

    /// Chooses how events are written (default [`WriteMode::Table`]). The zero-growth and
    /// WAL-only modes need the CDC relay and issue no NOTIFY (the stream wakes the relay).
    pub fn write_mode(mut self, mode: WriteMode) -> Self {
        self.mode = mode;
        self
    }

    async fn insert(&self, conn: &mut PgConnection, events: &[Event]) -> Result<Vec<Uuid>, Error> {
        let columns = Columns::from(events);
        let channel = self.notify.then(|| self.tables.channel());
        columns
            .bind(sqlx::query(&self.enqueue_sql))
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
            if let Some(e) = conflicting(&error, events) {
                return Error::DuplicateAggregateVersion {
                    aggregate_type: e.aggregate_type.clone(),
                    aggregate_id: e.aggregate_id.clone(),
                    version: e.aggregate_version.unwrap_or_default(),
                };
            }
        }
        if let Some(db) = error.as_database_error() {
            if db.code().as_deref() == Some("42P01") {
                return Error::Schema(crate::error::SchemaError::Missing);
            }
        }
        Error::Database(error)
    }
}

impl Outbox for PgOutbox {
    type Database = sqlx::Postgres;
    type Inbox = PgInbox;

    fn tables(&self) -> &Tables {
        &self.tables
    }

    fn inbox(&self) -> PgInbox {
        PgInbox::new(&self.tables)
    }

    /// Creates or upgrades the outbox schema: the pending migrations in one transaction under
    /// the schema's advisory lock.
    async fn migrate(&self, pool: &PgPool, options: MigrateOptions) -> Result<(), Error> {
        super::migrate::run(pool, &self.tables, options).await
    }

    /// The migrations in one transaction under the advisory lock `migrate` takes, each
    /// followed by the bookkeeping row that tells a later `migrate` and every relay it is
    /// applied (`psql -v ON_ERROR_STOP=1 -f FILE`). With `pool`, `options` are checked against
    /// the existing outbox. A new outbox's conversion to time partitions is not printable (it
    /// reads the indexes the migrations create) and is refused.
    async fn migration_script(
        &self,
        pool: Option<&PgPool>,
        options: MigrateOptions,
    ) -> Result<String, Error> {
        super::migrate::script(pool, &self.tables, options).await
    }

    /// Writes the events in one statement, as [`WriteMode`] says.
    async fn enqueue_batch(
        &self,
        conn: &mut PgConnection,
        events: &[Event],
    ) -> Result<Vec<Uuid>, Error> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        crate::event::validate_all(events, self.max_payload_bytes)?;
        match self.mode {
            WriteMode::Table => self.insert(conn, events).await,
            WriteMode::ZeroGrowth => {
                let columns = Columns::from(events);
                columns
                    .bind(sqlx::query(&self.zero_growth_sql))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| self.map_insert_error(e, events))?;
                Ok(columns.event_id)
            }
            WriteMode::WalOnly => {
                let contents: Vec<Vec<u8>> =
                    events.iter().map(crate::wal::WalEvent::encode).collect();
                let emitted: i64 = sqlx::query_scalar(&self.emit_sql)
                    .bind(&self.prefix)
                    .bind(&contents)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(Error::Database)?;
                if emitted == 0 {
                    // No slot would ever decode the messages: keep the events as rows.
                    return self.insert(conn, events).await;
                }
                Ok(events.iter().map(|e| e.event_id).collect())
            }
        }
    }
}

/// The event of the batch whose key the database reports taken: PostgreSQL's detail reads
/// `Key (aggregate_type, aggregate_id, aggregate_version)=(acct, 1, 3) already exists.` (the
/// partition trigger of migration 0018 writes the same). `None` when no event's key is in it.
fn conflicting<'e>(error: &sqlx::Error, events: &'e [Event]) -> Option<&'e Event> {
    let detail = error
        .as_database_error()?
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?
        .detail()?;
    events.iter().find(|e| {
        e.aggregate_version.is_some_and(|version| {
            let key = format!("=({}, {}, {version})", e.aggregate_type, e.aggregate_id);
            detail.contains(&key)
        })
    })
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

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
    headers: Vec<Json<crate::headers::Headers>>,
    occurred_at: Vec<Option<chrono::DateTime<chrono::Utc>>>,
}

impl Columns {
    /// Binds the eleven column arrays, in the order of `sql/enqueue.sql`.
    fn bind<'q>(&'q self, query: PgQuery<'q>) -> PgQuery<'q> {
        query
            .bind(&self.event_id)
            .bind(&self.aggregate_type)
            .bind(&self.aggregate_id)
            .bind(&self.aggregate_version)
            .bind(&self.event_type)
            .bind(&self.schema_version)
            .bind(&self.destination)
            .bind(&self.payload)
            .bind(&self.content_type)
            .bind(&self.headers)
            .bind(&self.occurred_at)
    }
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
            headers: events
                .iter()
                .map(|e| Json(e.stored_headers().into_owned()))
                .collect(),
            occurred_at: events.iter().map(|e| e.occurred_at).collect(),
        }
    }
}
