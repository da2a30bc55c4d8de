//! Time-partitioned outboxes: the events table range-partitioned by `occurred_at` in slices of
//! N days, so retention drops whole partitions (no row deletes, no bloat, no vacuum debt)
//! instead of deleting rows. Chosen at creation (`MigrateOptions::time_partition_days`);
//! partitions are created ahead of time by `migrate`, the relay and `outbox purge`.
//!
//! A partition is dropped only when it ends before the retention cut-off **and** holds no
//! pending or dead event; one that still does keeps its rows (row purge removes its published
//! ones) and is dropped on a later run. Dropping never waits for a lock (see
//! [`drop_expired`]): every relay runs it periodically, and a drop queued for the events
//! table's lock would stall every writer behind it.

use chrono::{DateTime, Days, NaiveDate, Utc};
use sqlx::{Executor, PgConnection, PgPool, Postgres, Row, Transaction};

use crate::{
    error::{Error, SchemaError},
    ident::Tables,
};

/// How far ahead partitions are created when nothing else is said.
pub const DEFAULT_PREMAKE_DAYS: u64 = 7;

/// One partition of a time-partitioned events table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimePartition {
    /// Table name (`events_p20261130`).
    pub name: String,
    /// First day it covers (UTC, inclusive).
    pub from: NaiveDate,
    /// First day it no longer covers (exclusive).
    pub to: NaiveDate,
}

/// What [`drop_expired`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DropReport {
    /// Partitions dropped, with the rows each held.
    pub dropped: Vec<(String, i64)>,
    /// Expired partitions kept because they still hold pending or dead events.
    pub kept: Vec<String>,
    /// Expired partitions left for a later run because a lock the drop needs was not free at
    /// once: another process was dropping partitions of this outbox, or a transaction was using
    /// the events table. The drop never waits for a lock.
    pub busy: Vec<String>,
}

fn err(why: impl Into<String>) -> Error {
    Error::Schema(SchemaError::TimePartitioning(why.into()))
}

/// The partition width in days, or `None` for a plain table.
pub async fn width(pool: &PgPool, tables: &Tables) -> Result<Option<i32>, Error> {
    sqlx::query_scalar(&tables.render("SELECT time_partition_days FROM {schema}.meta"))
        .fetch_one(pool)
        .await
        .map_err(Error::Database)
}

/// Makes the new, empty events table time-partitioned, inside the migration's transaction.
pub(super) async fn convert(
    tx: &mut Transaction<'_, Postgres>,
    tables: &Tables,
    days: i32,
) -> Result<(), Error> {
    if !(1..=366).contains(&days) {
        return Err(err(format!(
            "partition width must be 1 to 366 days, got {days}"
        )));
    }
    if tables.events().as_str().len() > 50 {
        return Err(err(
            "the events table name must be at most 50 characters to name its partitions",
        ));
    }
    // Indexes other than the keys, recreated on the partitioned table under the same names;
    // the unique version index becomes a plain one (the trigger enforces it).
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
         WHERE i.indrelid = $1::regclass
           AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)",
    )
    .bind(tables.render("{schema}.{events}"))
    .fetch_all(&mut **tx)
    .await
    .map_err(Error::Database)?;
    let convert = tables.render(include_str!("sql/time_partitioned.sql"));
    (&mut **tx)
        .execute(sqlx::raw_sql(&convert))
        .await
        .map_err(Error::Database)?;
    for definition in indexes {
        let definition = definition.replacen("CREATE UNIQUE INDEX", "CREATE INDEX", 1);
        (&mut **tx)
            .execute(sqlx::raw_sql(&definition))
            .await
            .map_err(Error::Database)?;
    }
    sqlx::query(&tables.render("UPDATE {schema}.meta SET time_partition_days = $1"))
        .bind(days)
        .execute(&mut **tx)
        .await
        .map_err(Error::Database)?;
    let today = Utc::now().date_naive();
    create_covering(
        tx,
        tables,
        days,
        today,
        today + Days::new(DEFAULT_PREMAKE_DAYS),
    )
    .await?;
    Ok(())
}

/// The partition containing `day` starts on a multiple of `days` since 1970-01-01.
fn slice_start(day: NaiveDate, days: i32) -> NaiveDate {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch");
    let since = (day - epoch).num_days();
    let start = since - since.rem_euclid(days as i64);
    epoch + chrono::Duration::days(start)
}

fn partition_name(tables: &Tables, from: NaiveDate) -> String {
    format!("{}_p{}", tables.events().as_str(), from.format("%Y%m%d"))
}

async fn create_covering(
    connection: &mut PgConnection,
    tables: &Tables,
    days: i32,
    first: NaiveDate,
    last: NaiveDate,
) -> Result<Vec<String>, Error> {
    let mut created = Vec::new();
    let mut from = slice_start(first, days);
    while from <= last {
        let to = from + Days::new(days as u64);
        let name = partition_name(tables, from);
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(format!("{}.{name}", tables.schema()))
            .fetch_one(&mut *connection)
            .await
            .map_err(Error::Database)?;
        if !exists {
            // Dates only: the rendered bounds are digits and dashes, never user text.
            let sql = tables.render(&format!(
                "CREATE TABLE {{schema}}.{name} PARTITION OF {{schema}}.{{events}}
                 FOR VALUES FROM ('{from} 00:00:00+00') TO ('{to} 00:00:00+00')"
            ));
            (&mut *connection)
                .execute(sqlx::raw_sql(&sql))
                .await
                .map_err(|e| {
                    err(format!(
                        "creating partition {name} ({from} to {to}): {e}; rows for those days \
                         may already sit in the default partition"
                    ))
                })?;
            created.push(name);
        }
        from = to;
    }
    Ok(created)
}

/// Creates the partitions covering `first..=last` (UTC days) that do not exist yet; returns
/// their names. A no-op on a plain table.
pub async fn ensure(
    pool: &PgPool,
    tables: &Tables,
    first: NaiveDate,
    last: NaiveDate,
) -> Result<Vec<String>, Error> {
    match width(pool, tables).await? {
        Some(days) => {
            let mut connection = pool.acquire().await.map_err(Error::Database)?;
            create_covering(&mut connection, tables, days, first, last).await
        }
        None => Ok(Vec::new()),
    }
}

/// Creates the partitions from today to `premake_days` ahead.
pub async fn ensure_ahead(
    pool: &PgPool,
    tables: &Tables,
    premake_days: u64,
) -> Result<Vec<String>, Error> {
    let today = Utc::now().date_naive();
    ensure(pool, tables, today, today + Days::new(premake_days)).await
}

/// The time partitions (not the default one), oldest first.
pub async fn list(pool: &PgPool, tables: &Tables) -> Result<Vec<TimePartition>, Error> {
    let Some(days) = width(pool, tables).await? else {
        return Ok(Vec::new());
    };
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = $1::regclass ORDER BY 1",
    )
    .bind(tables.render("{schema}.{events}"))
    .fetch_all(pool)
    .await
    .map_err(Error::Database)?;
    let prefix = format!("{}_p", tables.events().as_str());
    Ok(names
        .into_iter()
        .filter_map(|name| {
            let from = NaiveDate::parse_from_str(name.strip_prefix(&prefix)?, "%Y%m%d").ok()?;
            Some(TimePartition {
                to: from + Days::new(days as u64),
                from,
                name,
            })
        })
        .collect())
}

/// Drops every partition that ends at or before `cutoff` and holds only published events
/// (moving its rows to the archive table first when `archive`), without ever waiting for a
/// lock:
///
/// - one process at a time: each partition's transaction first takes the advisory lock
///   `hashtextextended('outbox.drop_partitions."<schema>"."<table>"', 0)` if it is free;
///   when another relay (or `outbox purge`) holds it, this run stops and reports the
///   partitions it did not handle as [`DropReport::busy`];
/// - a partition that still holds a pending or dead event is found without any lock on the
///   events table and reported as kept;
/// - the events table is then locked with `NOWAIT` (SHARE ROW EXCLUSIVE to check the partition
///   again, since an event may have become pending meanwhile; ACCESS EXCLUSIVE to detach it).
///   When a transaction holds a conflicting lock (any open writer does), the partition is
///   reported as busy and left for the next run: queueing for the lock would stall every
///   writer behind the request. `lock_timeout` (50 ms) bounds the few locks the statements
///   take on other tables.
pub async fn drop_expired(
    pool: &PgPool,
    tables: &Tables,
    cutoff: DateTime<Utc>,
    archive: bool,
    dry_run: bool,
) -> Result<DropReport, Error> {
    let mut report = DropReport::default();
    let mut expired = list(pool, tables).await?.into_iter().filter(|partition| {
        partition
            .to
            .and_hms_opt(0, 0, 0)
            .expect("midnight")
            .and_utc()
            <= cutoff
    });
    while let Some(partition) = expired.next() {
        match drop_one(pool, tables, &partition.name, archive, dry_run).await? {
            Outcome::Dropped(rows) => report.dropped.push((partition.name, rows)),
            Outcome::Kept => report.kept.push(partition.name),
            Outcome::Busy => report.busy.push(partition.name),
            Outcome::Gone => {}
            Outcome::Elsewhere => {
                report.busy.push(partition.name);
                report.busy.extend(expired.map(|partition| partition.name));
                break;
            }
        }
    }
    Ok(report)
}

/// What became of one expired partition.
enum Outcome {
    /// Dropped (or, in a dry run, would be), with the rows it held.
    Dropped(i64),
    /// It still holds a pending or dead event.
    Kept,
    /// A lock on the events table was not free at once.
    Busy,
    /// Another process dropped it since it was listed.
    Gone,
    /// Another process holds the drop's advisory lock.
    Elsewhere,
}

/// Handles one expired partition in a short transaction of its own, committed only when it
/// drops the partition; a lock that is not free at once makes it [`Outcome::Busy`].
async fn drop_one(
    pool: &PgPool,
    tables: &Tables,
    name: &str,
    archive: bool,
    dry_run: bool,
) -> Result<Outcome, Error> {
    let mut tx = pool.begin().await.map_err(Error::Database)?;
    let outcome = match examine_and_drop(&mut tx, tables, name, archive, dry_run).await {
        Ok(outcome) => outcome,
        Err(error) if lock_not_available(&error) => Outcome::Busy,
        Err(error) => return Err(Error::Database(error)),
    };
    if matches!(outcome, Outcome::Dropped(_)) && !dry_run {
        tx.commit().await.map_err(Error::Database)?;
    } else {
        // Releases the locks now, not when the pool next hands out the connection.
        tx.rollback().await.map_err(Error::Database)?;
    }
    Ok(outcome)
}

/// `NOWAIT` and `lock_timeout` both fail with `lock_not_available`.
fn lock_not_available(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "55P03")
}

/// The checks and (unless `dry_run`) the drop, inside `tx`; the caller commits or rolls back.
async fn examine_and_drop(
    tx: &mut Transaction<'_, Postgres>,
    tables: &Tables,
    name: &str,
    archive: bool,
    dry_run: bool,
) -> Result<Outcome, sqlx::Error> {
    let parent = tables.render("{schema}.{events}");
    let qualified = format!("{}.{name}", tables.schema());
    tx.execute("SET LOCAL lock_timeout = '50ms'").await?;
    let ours: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtextextended('outbox.drop_partitions.' || $1, 0))",
    )
    .bind(&parent)
    .fetch_one(&mut **tx)
    .await?;
    if !ours {
        return Ok(Outcome::Elsewhere);
    }
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&qualified)
        .fetch_one(&mut **tx)
        .await?;
    if !exists {
        return Ok(Outcome::Gone);
    }
    // Without the table lock: reading the partition itself conflicts with no writer.
    let open: bool = sqlx::query_scalar(&format!(
        "SELECT EXISTS (SELECT 1 FROM {qualified} WHERE status <> 'published')"
    ))
    .fetch_one(&mut **tx)
    .await?;
    if open {
        return Ok(Outcome::Kept);
    }
    // Writers and the relay reach the partition through the parent: with the parent locked, no
    // event can become pending in it between this check and the drop.
    tx.execute(sqlx::raw_sql(&format!(
        "LOCK TABLE {parent} IN SHARE ROW EXCLUSIVE MODE NOWAIT"
    )))
    .await?;
    let row = sqlx::query(&format!(
        "SELECT count(*) AS total, count(*) FILTER (WHERE status <> 'published') AS open
         FROM {qualified}"
    ))
    .fetch_one(&mut **tx)
    .await?;
    let (total, open): (i64, i64) = (row.get("total"), row.get("open"));
    if open > 0 {
        return Ok(Outcome::Kept);
    }
    if dry_run {
        return Ok(Outcome::Dropped(total));
    }
    if archive && total > 0 {
        tx.execute(sqlx::raw_sql(&format!(
            "{} SELECT * FROM {qualified}",
            tables.render("INSERT INTO {schema}.{events_name}_archive")
        )))
        .await?;
    }
    tx.execute(sqlx::raw_sql(&format!(
        "LOCK TABLE {parent} IN ACCESS EXCLUSIVE MODE NOWAIT;
         ALTER TABLE {parent} DETACH PARTITION {qualified};
         DROP TABLE {qualified};"
    )))
    .await?;
    Ok(Outcome::Dropped(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_aligned_on_the_epoch() {
        let d = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
        assert_eq!(slice_start(d("2026-11-30"), 1), d("2026-11-30"));
        // 2026-11-30 is day 20,787 since 1970-01-01; 20,787 = 7 * 2,969 + 4.
        assert_eq!(slice_start(d("2026-11-30"), 7), d("2026-11-26"));
        assert_eq!(slice_start(d("1969-12-31"), 7), d("1969-12-25"));
    }
}
