//! MySQL 8 / MariaDB 10.6+ storage (sqlx). The same contract as PostgreSQL's, in tables named
//! `{schema}_events`, `{schema}_inbox`, … in the connection's database (a MySQL schema is a
//! database; the prefix keeps several outboxes apart in one). Partitions and leases as on
//! PostgreSQL: any number of relays share the work.

use std::time::Duration;

use sqlx::{Connection, Executor, MySqlConnection, MySqlPool};
use uuid::Uuid;

mod session;

pub use session::{is_mariadb, Session};

use crate::{
    event::validate_all, Error, Event, MigrateOptions, SchemaError, Seen, Tables,
    DEFAULT_MAX_PAYLOAD_BYTES,
};

/// The migrations this build ships for MySQL and MariaDB.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "create outbox and inbox",
        include_str!("migrations/0001_create_outbox.sql"),
    ),
    (
        2,
        "inbox: text message ids and event types",
        include_str!("migrations/0002_inbox_message_ids.sql"),
    ),
    (
        3,
        "arrival time by the database clock",
        include_str!("migrations/0003_enqueued_at.sql"),
    ),
    (
        4,
        "byte-exact keys (NO PAD binary collation)",
        include_str!("migrations/0004_byte_exact_keys.sql"),
    ),
];

/// Checksums an earlier build recorded for migrations whose text has changed since with the
/// same effect: 0002 was a bare `ALTER TABLE`, which failed when run again.
const EARLIER_CHECKSUMS: &[(i32, &str)] = &[(2, "2891bd0cd67c407f")];

/// Partition count of a new MySQL outbox when none is given (as PostgreSQL's).
pub const DEFAULT_PARTITIONS: i32 = crate::DEFAULT_PARTITIONS;

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
        let insert_sql = tables.render_mysql(
            "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, aggregate_version, \
             event_type, schema_version, destination, payload, content_type, headers, occurred_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(?, UTC_TIMESTAMP(6)))",
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

    /// Creates or upgrades the tables. Concurrent migrators queue on a named lock
    /// (`GET_LOCK`), then find the work done. MySQL commits DDL statement by statement, so
    /// every statement can run again: a migration cut short completes on the next run.
    /// `options.partitions` is the partition count of a new outbox (default 32); time
    /// partitioning is PostgreSQL's only.
    pub async fn migrate(&self, pool: &MySqlPool, options: MigrateOptions) -> Result<(), Error> {
        if options.time_partition_days.is_some() {
            return Err(Error::Schema(SchemaError::TimePartitioning(
                "time partitioning is available on PostgreSQL only".into(),
            )));
        }
        let partitions = options.partitions.unwrap_or(DEFAULT_PARTITIONS);
        if !(1..=4096).contains(&partitions) {
            return Err(Error::Schema(SchemaError::BadPartitionCount(partitions)));
        }
        // A connection of its own, closed at the end: a named lock lives as long as its
        // session, so a migration dropped half-way must not hand the lock back to the pool.
        let mut conn = pool.acquire().await.map_err(Error::Database)?.detach();
        let locked: Option<i64> = sqlx::query_scalar(&format!("SELECT GET_LOCK({LOCK}, 600)"))
            .bind(self.tables.schema().as_str())
            .fetch_one(&mut conn)
            .await
            .map_err(Error::Database)?;
        if locked != Some(1) {
            return Err(Error::Schema(SchemaError::Locked(
                "another migration held the outbox's migration lock for 600 s".into(),
            )));
        }
        let result = migrate_locked(&mut conn, &self.tables, partitions, options.partitions).await;
        let _ = conn.close().await;
        result
    }

    /// What [`migrate`](Self::migrate) would apply, as one SQL script for teams whose DBAs
    /// apply schema changes with their own tools (`mysql --database=DB < FILE`): the
    /// migrations' statements under the named lock `migrate` takes, each migration followed by
    /// its bookkeeping row, then the lease rows. With `pool`, only what the database lacks
    /// (read, nothing written; `options` checked against the existing outbox); without, every
    /// migration, for a new outbox.
    pub async fn migration_script(
        &self,
        pool: Option<&MySqlPool>,
        options: MigrateOptions,
    ) -> Result<String, Error> {
        if options.time_partition_days.is_some() {
            return Err(Error::Schema(SchemaError::TimePartitioning(
                "time partitioning is available on PostgreSQL only".into(),
            )));
        }
        let mut partitions = options.partitions.unwrap_or(DEFAULT_PARTITIONS);
        if !(1..=4096).contains(&partitions) {
            return Err(Error::Schema(SchemaError::BadPartitionCount(partitions)));
        }
        let tables = &self.tables;
        let (applied, leases) = match pool {
            Some(pool) => applied(pool, tables).await?,
            None => (Vec::new(), 0),
        };
        let due = crate::migration::due_accepting(&applied, MIGRATIONS, EARLIER_CHECKSUMS)?;
        if let (false, Some(pool)) = (applied.is_empty(), pool) {
            let existing = partition_count(pool, tables).await?;
            check_partitions(existing, options.partitions)?;
            partitions = existing;
        }
        let mut script = crate::migration_script::Script::new(
            "MySQL and MariaDB",
            &tables.render_mysql("{events}"),
        );
        if due.is_empty() && leases >= i64::from(partitions) {
            return Ok(script.finish());
        }
        script.comment(
            "MySQL commits DDL statement by statement. If the script stops half-way, print it \
             again:\nmigrations recorded as applied are left out, and every statement of the \
             one cut short can run again.",
        );
        let lock = LOCK.replace(
            '?',
            &crate::migration_script::literal(tables.schema().as_str()),
        );
        script.comment(
            "The lock `outbox migrate` takes: concurrent migrators queue. Not taken within 600 s, \
             the\nstatement fails (a subquery of two rows) and the script stops.",
        );
        script.statement(&format!(
            "SELECT IF(GET_LOCK({lock}, 600) = 1, 1, (SELECT 1 UNION SELECT 2)) INTO @outbox_migrate_lock"
        ));
        script.comment(&format!(
            "A statement waits at most {DDL_LOCK_WAIT_SECONDS} s for a transaction still open on \
             the tables, so that the\napplication's writes never queue behind it; if one gives \
             up, print the script again and rerun it later."
        ));
        script.statement(&format!(
            "SET SESSION lock_wait_timeout = {DDL_LOCK_WAIT_SECONDS}"
        ));
        script.statement(&tables.render_mysql(BOOTSTRAP));
        for (version, description, template) in due {
            script.migration(*version, description);
            for statement in statements(&render(tables, template, partitions)) {
                script.statement(statement);
            }
            script.statement(&format!(
                "{} ({version}, {}, {})",
                tables.render_mysql(RECORD),
                crate::migration_script::literal(description),
                crate::migration_script::literal(&crate::migration::checksum(template))
            ));
        }
        script.comment("One lease row per partition.");
        let values: Vec<String> = (0..partitions).map(|p| format!("({p})")).collect();
        script.statement(&format!(
            "{} {}",
            tables.render_mysql(LEASE),
            values.join(", ")
        ));
        script.statement(&format!("SELECT RELEASE_LOCK({lock})"));
        Ok(script.finish())
    }

    /// Writes one event inside the caller's transaction and returns its id. Never commits.
    pub async fn enqueue(&self, conn: &mut MySqlConnection, event: &Event) -> Result<Uuid, Error> {
        self.enqueue_batch(conn, std::slice::from_ref(event))
            .await
            .map(|ids| ids[0])
    }

    /// Writes typed `event` of aggregate `aggregate_id` inside the caller's transaction and
    /// returns its id: [`Event::of`] then [`enqueue`](Self::enqueue). Never commits.
    pub async fn publish<E: crate::DomainEvent + ?Sized>(
        &self,
        conn: &mut MySqlConnection,
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
        conn: &mut MySqlConnection,
        events: &[Event],
    ) -> Result<Vec<Uuid>, Error> {
        validate_all(events, self.max_payload_bytes)?;
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

/// The statements of a migration file, one per `;` at the end of a line (the file's last one
/// too), without the ones that are only comments.
pub(crate) fn statements(sql: &str) -> impl Iterator<Item = &str> {
    sql.split(";\n")
        .map(|s| s.trim().trim_end_matches(';'))
        .filter(|s| {
            s.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with("--"))
        })
}

/// The name of the lock migrators take, `?` standing for the schema.
const LOCK: &str = "CONCAT('outbox.migrate.', LEFT(DATABASE(), 16), '.', LEFT(?, 32))";

/// The bookkeeping table every run starts with.
const BOOTSTRAP: &str = "CREATE TABLE IF NOT EXISTS {migrations} (
    version     INT          NOT NULL PRIMARY KEY,
    description VARCHAR(255) NOT NULL,
    checksum    VARCHAR(64)  NOT NULL,
    applied_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4";

/// The bookkeeping row of an applied migration, up to its values.
const RECORD: &str = "INSERT INTO {migrations} (version, description, checksum) VALUES";

/// Lease rows, up to their values (the ones already there are kept).
const LEASE: &str = "INSERT IGNORE INTO {leases} (`partition`) VALUES";

/// A migration template rendered for this outbox.
fn render(tables: &Tables, template: &str, partitions: i32) -> String {
    tables
        .render_mysql(template)
        .replace("{partitions}", &partitions.to_string())
}

/// The migrations the database records (version, checksum) and its lease rows; none when the
/// bookkeeping table does not exist. Reads only.
async fn applied(pool: &MySqlPool, tables: &Tables) -> Result<(Vec<(i32, String)>, i64), Error> {
    let exists: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(tables.render_mysql("{migrations}"))
    .fetch_one(pool)
    .await
    .map_err(Error::Database)?;
    if exists == 0 {
        return Ok((Vec::new(), 0));
    }
    let applied = sqlx::query_as(
        &tables.render_mysql("SELECT version, checksum FROM {migrations} ORDER BY version"),
    )
    .fetch_all(pool)
    .await
    .map_err(Error::Database)?;
    let leases: i64 = sqlx::query_scalar(&tables.render_mysql("SELECT count(*) FROM {leases}"))
        .fetch_one(pool)
        .await
        .unwrap_or(0);
    Ok((applied, leases))
}

/// The partition count the outbox was created with.
async fn partition_count<'c>(
    conn: impl sqlx::Executor<'c, Database = sqlx::MySql>,
    tables: &Tables,
) -> Result<i32, Error> {
    sqlx::query_scalar(&tables.render_mysql("SELECT partitions FROM {meta} WHERE singleton = 1"))
        .fetch_one(conn)
        .await
        .map_err(Error::Database)
}

/// Checks the partition count asked for against the one the outbox was created with.
fn check_partitions(existing: i32, requested: Option<i32>) -> Result<(), Error> {
    match requested {
        Some(requested) if requested != existing => {
            Err(Error::Schema(SchemaError::PartitionMismatch {
                existing,
                requested,
            }))
        }
        _ => Ok(()),
    }
}

async fn migrate_locked(
    conn: &mut MySqlConnection,
    tables: &Tables,
    partitions: i32,
    requested: Option<i32>,
) -> Result<(), Error> {
    conn.execute(sqlx::raw_sql(&tables.render_mysql(BOOTSTRAP)))
        .await
        .map_err(Error::Database)?;
    let applied: Vec<(i32, String)> = sqlx::query_as(
        &tables.render_mysql("SELECT version, checksum FROM {migrations} ORDER BY version"),
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::Database)?;
    for (version, description, template) in
        crate::migration::due_accepting(&applied, MIGRATIONS, EARLIER_CHECKSUMS)?
    {
        for statement in statements(&render(tables, template, partitions)) {
            run_step(conn, statement).await?;
        }
        sqlx::query(&format!("{} (?, ?, ?)", tables.render_mysql(RECORD)))
            .bind(version)
            .bind(description)
            .bind(crate::migration::checksum(template))
            .execute(&mut *conn)
            .await
            .map_err(Error::Database)?;
    }
    let existing = partition_count(&mut *conn, tables).await?;
    // One lease row per partition (a loop rather than a recursive query: MySQL caps
    // recursion at 1,000 rows by default).
    let lease = format!("{} (?)", tables.render_mysql(LEASE));
    let have: i64 = sqlx::query_scalar(&tables.render_mysql("SELECT count(*) FROM {leases}"))
        .fetch_one(&mut *conn)
        .await
        .map_err(Error::Database)?;
    if have < i64::from(existing) {
        for partition in 0..existing {
            sqlx::query(&lease)
                .bind(partition)
                .execute(&mut *conn)
                .await
                .map_err(Error::Database)?;
        }
    }
    check_partitions(existing, requested)
}

/// How long one migration statement waits for the table's metadata lock before it gives way:
/// while an `ALTER TABLE` waits for a transaction still open on the table (a report, a dump),
/// every new statement on that table queues behind it, the application's inserts included.
const DDL_LOCK_WAIT_SECONDS: u32 = 2;

/// Attempts of one migration statement that meets a lock wait timeout, a second apart.
const DDL_ATTEMPTS: u32 = 30;

/// Runs one migration statement waiting at most [`DDL_LOCK_WAIT_SECONDS`] for its locks, again
/// after a pause each time it times out (every statement can run again): the application's
/// writes queue behind it for that long at most, then go on while it waits its turn.
async fn run_step(conn: &mut MySqlConnection, statement: &str) -> Result<(), Error> {
    conn.execute(sqlx::raw_sql(&format!(
        "SET SESSION lock_wait_timeout = {DDL_LOCK_WAIT_SECONDS}"
    )))
    .await
    .map_err(Error::Database)?;
    let mut attempt = 1;
    loop {
        match conn.execute(sqlx::raw_sql(statement)).await {
            Ok(_) => return Ok(()),
            Err(e) if error_number(&e) == Some(1205) && attempt < DDL_ATTEMPTS => {
                attempt += 1;
                // The pause on the server: the library depends on no async runtime.
                conn.execute(sqlx::raw_sql("DO SLEEP(1)"))
                    .await
                    .map_err(Error::Database)?;
            }
            Err(e) if error_number(&e) == Some(1205) => {
                return Err(Error::Schema(SchemaError::Locked(format!(
                    "a migration statement waited {DDL_ATTEMPTS} times for a transaction \
                     still open on the outbox's tables ({e}); run migrate again once it ends"
                ))))
            }
            Err(e) => return Err(Error::Database(e)),
        }
    }
}

/// The server's error number (1205: lock wait timeout, 1062: duplicate key, …), when `error`
/// comes from MySQL or MariaDB.
pub fn error_number(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()?
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number())
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

/// The MySQL inbox (see [`crate::postgres::PgInbox`] for the contract).
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
            // IGNORE turns only the duplicate key into "no row": the consumer name, the
            // message id and the event type are checked first (non-empty, at most 255
            // characters), so no other error can be ignored.
            record_sql: tables.render_mysql(
                "INSERT IGNORE INTO {inbox} (consumer, event_id, event_type) VALUES (?, ?, ?)",
            ),
            // The purge reads the keys of a batch without a lock, then deletes them by
            // primary key: a locking range scan on `processed_at` would lock the gap new
            // rows go into (under REPEATABLE READ) and make every consumer's insert wait.
            purgeable_sql: tables.render_mysql(
                "SELECT consumer, event_id FROM {inbox} \
                 WHERE processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                 ORDER BY processed_at LIMIT ?",
            ),
            delete_sql: tables.render_mysql(
                "DELETE FROM {inbox} WHERE consumer = ? AND event_id = ? \
                 AND processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND",
            ),
        }
    }

    /// Records `event_id` for `consumer` inside the caller's transaction. Never commits.
    pub async fn record(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<Seen, Error> {
        self.record_message(conn, consumer, &event_id.to_string(), None)
            .await
    }

    /// Records any text `message_id` (at most 255 characters) and the event type for
    /// `consumer` (see [`crate::postgres::PgInbox::record_message`]).
    pub async fn record_message(
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

    /// Deletes rows older than `retention`, `batch` rows per statement.
    pub async fn purge(
        &self,
        pool: &MySqlPool,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, Error> {
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_migration_splits_into_its_statements_without_comment_only_ones() {
        let sql = "-- header\nCREATE TABLE a (x INT);\n\n-- note\nINSERT INTO a VALUES (1);\n";
        let found: Vec<_> = super::statements(sql).collect();
        assert_eq!(
            found,
            [
                "-- header\nCREATE TABLE a (x INT)",
                "-- note\nINSERT INTO a VALUES (1)"
            ]
        );
    }
}
