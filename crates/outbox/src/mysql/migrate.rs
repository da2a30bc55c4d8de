//! The MySQL and MariaDB migrations: each statement can run again, under a named lock.

use sqlx::{Connection, Executor, MySqlConnection, MySqlPool};

use super::error_number;
use crate::{
    error::{Error, SchemaError},
    ident::Tables,
    migration::MigrateOptions,
    sql::named,
};

const SQL: &str = include_str!("sql/migrate.sql");

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
pub const DEFAULT_PARTITIONS: i32 = crate::migration::DEFAULT_PARTITIONS;

/// Creates or upgrades the tables. Concurrent migrators queue on a named lock
/// (`GET_LOCK`), then find the work done. MySQL commits DDL statement by statement, so
/// every statement can run again: a migration cut short completes on the next run.
/// `options.partitions` is the partition count of a new outbox (default 32); time
/// partitioning is PostgreSQL's only.
pub(super) async fn run(
    pool: &MySqlPool,
    tables: &Tables,
    options: MigrateOptions,
) -> Result<(), Error> {
    let partitions = partition_count_of(options)?;
    // A connection of its own, closed at the end: a named lock lives as long as its
    // session, so a migration dropped half-way must not hand the lock back to the pool.
    let mut conn = pool.acquire().await.map_err(Error::Database)?.detach();
    let locked: Option<i64> =
        sqlx::query_scalar(&format!("SELECT GET_LOCK({}, 600)", named(SQL, "lock")))
            .bind(tables.schema().as_str())
            .fetch_one(&mut conn)
            .await
            .map_err(Error::Database)?;
    if locked != Some(1) {
        return Err(Error::Schema(SchemaError::Locked(
            "another migration held the outbox's migration lock for 600 s".into(),
        )));
    }
    let result = migrate_locked(&mut conn, tables, partitions, options.partitions).await;
    let _ = conn.close().await;
    result
}

/// What [`migrate`](Self::migrate) would apply, as one SQL script for teams whose DBAs
/// apply schema changes with their own tools (`mysql --database=DB < FILE`): the
/// migrations' statements under the named lock `migrate` takes, each migration followed by
/// its bookkeeping row, then the lease rows. With `pool`, only what the database lacks
/// (read, nothing written; `options` checked against the existing outbox); without, every
/// migration, for a new outbox.
pub(super) async fn script(
    pool: Option<&MySqlPool>,
    tables: &Tables,
    options: MigrateOptions,
) -> Result<String, Error> {
    let mut partitions = partition_count_of(options)?;
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
    let mut script =
        crate::migration_script::Script::new("MySQL and MariaDB", &tables.render_mysql("{events}"));
    if due.is_empty() && leases >= i64::from(partitions) {
        return Ok(script.finish());
    }
    script.comment(
        "MySQL commits DDL statement by statement. If the script stops half-way, print it \
         again:\nmigrations recorded as applied are left out, and every statement of the \
         one cut short can run again.",
    );
    let lock = named(SQL, "lock").replace(
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
    script.statement(&tables.render_mysql(named(SQL, "bootstrap")));
    for (version, description, template) in due {
        script.migration(*version, description);
        for statement in statements(&render(tables, template, partitions)) {
            script.statement(statement);
        }
        script.statement(&format!(
            "{} ({version}, {}, {})",
            tables.render_mysql(named(SQL, "record")),
            crate::migration_script::literal(description),
            crate::migration_script::literal(&crate::migration::checksum(template))
        ));
    }
    script.comment("One lease row per partition.");
    let values: Vec<String> = (0..partitions).map(|p| format!("({p})")).collect();
    script.statement(&format!(
        "{} {}",
        tables.render_mysql(named(SQL, "lease")),
        values.join(", ")
    ));
    script.statement(&format!("SELECT RELEASE_LOCK({lock})"));
    Ok(script.finish())
}

/// The partition count a new outbox is created with, checked; time partitioning is refused.
fn partition_count_of(options: MigrateOptions) -> Result<i32, Error> {
    if options.time_partition_days.is_some() {
        return Err(Error::Schema(SchemaError::TimePartitioning(
            "time partitioning is available on PostgreSQL only".into(),
        )));
    }
    let partitions = options.partitions.unwrap_or(DEFAULT_PARTITIONS);
    if !(1..=4096).contains(&partitions) {
        return Err(Error::Schema(SchemaError::BadPartitionCount(partitions)));
    }
    Ok(partitions)
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

/// A migration template rendered for this outbox.
fn render(tables: &Tables, template: &str, partitions: i32) -> String {
    tables
        .render_mysql(template)
        .replace("{partitions}", &partitions.to_string())
}

/// The migrations the database records (version, checksum) and its lease rows; none when the
/// bookkeeping table does not exist. Reads only.
async fn applied(pool: &MySqlPool, tables: &Tables) -> Result<(Vec<(i32, String)>, i64), Error> {
    let exists: i64 = sqlx::query_scalar(named(SQL, "has_bookkeeping"))
        .bind(tables.render_mysql("{migrations}"))
        .fetch_one(pool)
        .await
        .map_err(Error::Database)?;
    if exists == 0 {
        return Ok((Vec::new(), 0));
    }
    let applied = sqlx::query_as(&tables.render_mysql(named(SQL, "applied")))
        .fetch_all(pool)
        .await
        .map_err(Error::Database)?;
    let leases: i64 = sqlx::query_scalar(&tables.render_mysql(named(SQL, "leases")))
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
    sqlx::query_scalar(&tables.render_mysql(named(SQL, "partitions")))
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
    conn.execute(sqlx::raw_sql(&tables.render_mysql(named(SQL, "bootstrap"))))
        .await
        .map_err(Error::Database)?;
    let applied: Vec<(i32, String)> = sqlx::query_as(&tables.render_mysql(named(SQL, "applied")))
        .fetch_all(&mut *conn)
        .await
        .map_err(Error::Database)?;
    for (version, description, template) in
        crate::migration::due_accepting(&applied, MIGRATIONS, EARLIER_CHECKSUMS)?
    {
        for statement in statements(&render(tables, template, partitions)) {
            run_step(conn, statement).await?;
        }
        sqlx::query(&format!(
            "{} (?, ?, ?)",
            tables.render_mysql(named(SQL, "record"))
        ))
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
    let lease = format!("{} (?)", tables.render_mysql(named(SQL, "lease")));
    let have: i64 = sqlx::query_scalar(&tables.render_mysql(named(SQL, "leases")))
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
