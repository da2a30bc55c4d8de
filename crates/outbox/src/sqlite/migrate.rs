//! The SQLite migrations: all pending ones in one `BEGIN IMMEDIATE` transaction.

use sqlx::{Executor, SqliteConnection, SqlitePool};

use crate::{
    error::{Error, SchemaError},
    ident::Tables,
    migration::MigrateOptions,
    sql::named,
};

const SQL: &str = include_str!("sql/migrate.sql");

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

/// Creates or upgrades the tables (idempotent; concurrent callers serialise on SQLite's
/// write lock).
pub(super) async fn run(
    pool: &SqlitePool,
    tables: &Tables,
    options: MigrateOptions,
) -> Result<(), Error> {
    check_options(options)?;
    // A transaction sqlx tracks: rolled back if this future is dropped half-way, rather
    // than left open on a pooled connection, holding the write lock.
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(Error::Database)?;
    let result = migrate_locked(&mut tx, tables).await;
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
pub(super) async fn script(
    pool: Option<&SqlitePool>,
    tables: &Tables,
    options: MigrateOptions,
) -> Result<String, Error> {
    check_options(options)?;
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
    script.comment("One transaction, holding the database's write lock as `outbox migrate` does.");
    script.statement("BEGIN IMMEDIATE");
    script.statement(&tables.render_sqlite(named(SQL, "bootstrap")));
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
            tables.render_sqlite(named(SQL, "record")),
            crate::migration_script::literal(description),
            crate::migration_script::literal(&crate::migration::checksum(template))
        ));
    }
    script.statement("COMMIT");
    Ok(script.finish())
}

/// Refuses what a SQLite outbox cannot be: partitioned (it has one partition, one relay at a
/// time) or partitioned by time.
fn check_options(options: MigrateOptions) -> Result<(), Error> {
    if options.partitions.is_some_and(|p| p != 1) {
        return Err(Error::Schema(SchemaError::Partitions(
            "a SQLite outbox has one partition (one relay at a time)".into(),
        )));
    }
    if options.time_partition_days.is_some() {
        return Err(Error::Schema(SchemaError::TimePartitioning(
            "time partitioning is available on PostgreSQL only".into(),
        )));
    }
    Ok(())
}

pub(super) async fn migrate_locked(
    conn: &mut SqliteConnection,
    tables: &Tables,
) -> Result<(), Error> {
    migrate_with(conn, tables, MIGRATIONS).await
}

/// The migrations the database records (version, checksum); none when the bookkeeping table
/// does not exist. Reads only.
async fn applied(
    conn: &mut SqliteConnection,
    tables: &Tables,
) -> Result<Vec<(i32, String)>, Error> {
    let exists: i64 = sqlx::query_scalar(named(SQL, "has_bookkeeping"))
        .bind(tables.render_sqlite("{migrations}"))
        .fetch_one(&mut *conn)
        .await
        .map_err(Error::Database)?;
    if exists == 0 {
        return Ok(Vec::new());
    }
    sqlx::query_as(&tables.render_sqlite(named(SQL, "applied")))
        .fetch_all(conn)
        .await
        .map_err(Error::Database)
}

/// Applies the migrations of `shipped` not yet applied.
pub(super) async fn migrate_with(
    conn: &mut SqliteConnection,
    tables: &Tables,
    shipped: &'static [crate::migration::Migration],
) -> Result<(), Error> {
    conn.execute(sqlx::raw_sql(
        &tables.render_sqlite(named(SQL, "bootstrap")),
    ))
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
        sqlx::query(&format!(
            "{} (?, ?, ?)",
            tables.render_sqlite(named(SQL, "record"))
        ))
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
pub(super) const REBUILDS_EVENTS: i32 = 7;

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
    let found: Vec<(String, String, String)> = sqlx::query_as(named(SQL, "dependents"))
        .bind(&events)
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::Database)?;
    Ok(found
        .into_iter()
        .map(|(kind, name, sql)| Dependent { kind, name, sql })
        .collect())
}

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod upgrade_tests;
