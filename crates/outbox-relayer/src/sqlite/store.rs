//! SQLite storage for the relay: one partition, so one active relay per database file (a
//! second relay waits as a standby for the lease). SQLite serialises writers, so checking the
//! lease epoch inside the write transaction fences every state change. Times in the lease,
//! relay and hold tables are unix milliseconds from SQLite's clock.

use std::{collections::HashSet, time::Duration};

use chrono::{DateTime, NaiveDateTime, Utc};
use futures::future::BoxFuture;
use outbox::{sql::named, Tables};
use sqlx::{Row, SqlitePool};
use uuid::Uuid;

use crate::{
    error::Error,
    store::{Backlog, Claimed, ClaimedRow, Failure, Fence, Marking, PartitionStatus, Store},
};

#[derive(Debug)]
struct Sql {
    now_ms: String,
    register: String,
    live_relays: String,
    forget_dead_relays: String,
    deregister: String,
    renew: String,
    acquire: String,
    release: String,
    held: String,
    claim: String,
    mark_published: String,
    release_holds: String,
    mark_failed: String,
    hold: String,
    unhold: String,
    parked_elsewhere: String,
    backlog: String,
    partitions: String,
    flag_behind: String,
    wait_behind: String,
    resume: String,
    drop_stale_holds: String,
    release_stale: String,
}

/// The relay's handle on a SQLite outbox.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: std::sync::Arc<Sql>,
}

impl SqliteStore {
    /// Opens the outbox at `tables` (migrated with `outbox::sqlite::SqliteOutbox::migrate`).
    pub async fn open(pool: SqlitePool, tables: &Tables) -> Result<Self, Error> {
        let file = include_str!("sql/store.sql");
        let r = |name: &str| tables.render_sqlite(named(file, name));
        let sql = Sql {
            now_ms: r("now_ms"),
            register: r("register"),
            live_relays: r("live_relays"),
            forget_dead_relays: r("forget_dead_relays"),
            deregister: r("deregister"),
            renew: r("renew"),
            acquire: r("acquire"),
            release: r("release"),
            held: r("held"),
            claim: r("claim"),
            mark_published: r("mark_published"),
            release_holds: r("release_holds"),
            mark_failed: r("mark_failed"),
            hold: r("hold"),
            unhold: r("unhold"),
            parked_elsewhere: r("parked_elsewhere"),
            backlog: r("backlog"),
            partitions: r("partitions"),
            flag_behind: r("flag_behind"),
            wait_behind: r("wait_behind"),
            resume: r("resume"),
            drop_stale_holds: r("drop_stale_holds"),
            release_stale: r("release_stale"),
        };
        let meta = tables.render_sqlite("SELECT partitions FROM {meta}");
        sqlx::query_scalar::<_, i64>(&meta)
            .fetch_one(&pool)
            .await
            .map_err(|e| match &e {
                sqlx::Error::Database(d) if d.message().contains("no such table") => {
                    Error::Outbox(outbox::Error::Schema(outbox::SchemaError::Missing))
                }
                _ => Error::Database(e),
            })?;
        let applied: Option<i32> =
            sqlx::query_scalar(&tables.render_sqlite("SELECT max(version) FROM {migrations}"))
                .fetch_one(&pool)
                .await?;
        outbox::require_migrated(applied, outbox::sqlite::MIGRATIONS)?;
        Ok(Self {
            pool,
            sql: std::sync::Arc::new(sql),
        })
    }

    /// The claim statement (parameters: partitions as JSON, limit, max payload bytes, now in
    /// ms, floor, byte budget), for `EXPLAIN QUERY PLAN` in tests.
    #[doc(hidden)]
    pub fn claim_statement(&self) -> &str {
        &self.sql.claim
    }

    async fn now_ms(&self, conn: &mut sqlx::SqliteConnection) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(&self.sql.now_ms).fetch_one(conn).await
    }

    /// A write transaction (`BEGIN IMMEDIATE` takes the write lock up front, so the lease
    /// check and the update cannot interleave with another writer). A transaction sqlx tracks:
    /// if the relay is aborted mid-way (a crash, as `RelayHandle::abort`), it is rolled back
    /// before its connection is used again, instead of going back to the pool still holding
    /// the database's write lock and blocking every other writer.
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }

    async fn fenced(
        &self,
        conn: &mut sqlx::SqliteConnection,
        relay_id: &str,
        fences: &[Fence],
    ) -> Result<HashSet<i32>, sqlx::Error> {
        let mut held = HashSet::new();
        for (partition, epoch) in fences {
            let n: i64 = sqlx::query_scalar(&self.sql.held)
                .bind(partition)
                .bind(epoch)
                .bind(relay_id)
                .fetch_one(&mut *conn)
                .await?;
            if n == 1 {
                held.insert(*partition);
            }
        }
        Ok(held)
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A time as SQLite rows hold it: RFC 3339, or `YYYY-MM-DD HH:MM:SS[.fff]` taken as UTC.
pub(crate) fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
                .ok()
                .map(|t| t.and_utc())
        })
}

/// A claimed SQLite row. SQLite keeps whatever text a writer gives: an event id that is not a
/// UUID or a time that cannot be parsed makes the row unreadable (dead-lettered with the
/// reason), never a stand-in value (a nil id would collide with every other such event in
/// the broker's deduplication and the inbox; "now" would hide the event's real age).
fn claimed(row: &sqlx::sqlite::SqliteRow) -> Result<ClaimedRow, sqlx::Error> {
    let text = |name: &str| row.try_get::<String, _>(name);
    let event_id = text("event_id")?;
    let headers = text("headers")?;
    let occurred_at = text("occurred_at")?;
    let parsed_id = Uuid::parse_str(&event_id);
    let parsed_at = parse_time(&occurred_at);
    let preview = |s: &str| s.chars().take(64).collect::<String>();
    let unreadable: Option<String> = row.try_get("unreadable")?;
    let unreadable = unreadable
        .or_else(|| {
            parsed_id
                .as_ref()
                .err()
                .map(|e| format!("event_id {:?} is not a UUID: {e}", preview(&event_id)))
        })
        .or_else(|| {
            parsed_at.is_none().then(|| {
                format!(
                    "occurred_at {:?} is not a time the relay can read (RFC 3339 or \
                     'YYYY-MM-DD HH:MM:SS')",
                    preview(&occurred_at)
                )
            })
        });
    Ok(ClaimedRow {
        id: row.try_get("id")?,
        event_id: parsed_id.unwrap_or_default(),
        aggregate_type: text("aggregate_type")?,
        aggregate_id: text("aggregate_id")?,
        aggregate_version: row.try_get("aggregate_version")?,
        event_type: text("event_type")?,
        schema_version: row.try_get("schema_version")?,
        destination: row.try_get("destination")?,
        payload: row
            .try_get::<Option<Vec<u8>>, _>("payload")?
            .map(Into::into),
        payload_size: row.try_get("payload_size")?,
        content_type: text("content_type")?,
        headers,
        unreadable,
        occurred_at: parsed_at,
        partition: row.try_get("partition")?,
        attempts: row.try_get("attempts")?,
        permanent_failures: row.try_get("permanent_failures")?,
        row_bytes: row.try_get("row_bytes")?,
    })
}

impl Store for SqliteStore {
    fn partitions(&self) -> i32 {
        1
    }

    fn heartbeat<'a>(
        &'a self,
        relay_id: &'a str,
        hostname: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<String>, sqlx::Error>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await?;
            let now = self.now_ms(&mut conn).await?;
            sqlx::query(&self.sql.register)
                .bind(relay_id)
                .bind(hostname)
                .bind(now)
                .execute(&mut *conn)
                .await?;
            sqlx::query(&self.sql.forget_dead_relays)
                .bind(now - 10 * millis(ttl))
                .execute(&mut *conn)
                .await?;
            sqlx::query_scalar(&self.sql.live_relays)
                .bind(now - millis(ttl))
                .fetch_all(&mut *conn)
                .await
        })
    }

    fn deregister<'a>(&'a self, relay_id: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query(&self.sql.deregister)
                .bind(relay_id)
                .execute(&self.pool)
                .await
                .map(drop)
        })
    }

    fn renew<'a>(
        &'a self,
        relay_id: &'a str,
        held: &'a [Fence],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<i32>, sqlx::Error>> {
        Box::pin(async move {
            let mut tx = self.begin_write().await?;
            let conn: &mut sqlx::SqliteConnection = &mut tx;
            let result = async {
                let now: i64 = sqlx::query_scalar(&self.sql.now_ms)
                    .fetch_one(&mut *conn)
                    .await?;
                let mut still = Vec::new();
                for (partition, epoch) in held {
                    let kept: Option<i32> = sqlx::query_scalar(&self.sql.renew)
                        .bind(partition)
                        .bind(epoch)
                        .bind(now + millis(ttl))
                        .bind(relay_id)
                        .fetch_optional(&mut *conn)
                        .await?;
                    still.extend(kept);
                }
                Ok(still)
            }
            .await;
            crate::db::finish(tx, result).await
        })
    }

    fn acquire<'a>(
        &'a self,
        relay_id: &'a str,
        n: i64,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Fence>, sqlx::Error>> {
        Box::pin(async move {
            let mut tx = self.begin_write().await?;
            let conn: &mut sqlx::SqliteConnection = &mut tx;
            let result = async {
                let now: i64 = sqlx::query_scalar(&self.sql.now_ms)
                    .fetch_one(&mut *conn)
                    .await?;
                let rows = sqlx::query(&self.sql.acquire)
                    .bind(n)
                    .bind(relay_id)
                    .bind(now + millis(ttl))
                    .bind(now)
                    .fetch_all(&mut *conn)
                    .await?;
                rows.iter()
                    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                    .collect()
            }
            .await;
            crate::db::finish(tx, result).await
        })
    }

    fn release<'a>(
        &'a self,
        relay_id: &'a str,
        leases: &'a [Fence],
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let mut tx = self.begin_write().await?;
            let conn: &mut sqlx::SqliteConnection = &mut tx;
            let result = async {
                for (partition, epoch) in leases {
                    sqlx::query(&self.sql.release)
                        .bind(partition)
                        .bind(epoch)
                        .bind(relay_id)
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            }
            .await;
            crate::db::finish(tx, result).await
        })
    }

    fn claim<'a>(
        &'a self,
        partitions: &'a [(i32, i64)],
        limit: i64,
        max_payload_bytes: usize,
        byte_budget: i64,
    ) -> BoxFuture<'a, Result<Claimed, sqlx::Error>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await?;
            let now = self.now_ms(&mut conn).await?;
            let parts: Vec<i32> = partitions.iter().map(|p| p.0).collect();
            // One partition: its floor is the floor.
            let floor = partitions.iter().map(|p| p.1).min().unwrap_or(0);
            let rows = sqlx::query(&self.sql.claim)
                .bind(serde_json::to_string(&parts).expect("integers"))
                .bind(limit)
                .bind(i64::try_from(max_payload_bytes).unwrap_or(i64::MAX))
                .bind(now)
                .bind(floor)
                .bind(byte_budget.max(1))
                .fetch_all(&mut *conn)
                .await?;
            let found: i64 = rows.first().map_or(Ok(0), |r| r.try_get("found"))?;
            let mut behind = Vec::new();
            let mut claimed_rows = Vec::new();
            for row in &rows {
                if row.try_get::<bool, _>("behind")? {
                    behind.push(row.try_get::<i64, _>("id")?);
                } else {
                    claimed_rows.push(
                        claimed(row).or_else(|error| ClaimedRow::unreadable_row(row, &error))?,
                    );
                }
            }
            drop(conn);
            if !behind.is_empty() {
                // Met once: set waiting, so that later claims do not walk them again.
                let mut tx = self.begin_write().await?;
                let flagged = sqlx::query(&self.sql.flag_behind)
                    .bind(serde_json::to_string(&behind).expect("integers"))
                    .execute(&mut *tx)
                    .await
                    .map(drop);
                crate::db::finish(tx, flagged).await?;
            }
            let cut = found > claimed_rows.len() as i64;
            Ok(Claimed {
                rows: claimed_rows,
                cut,
            })
        })
    }

    fn mark_published<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        ids: &'a [i64],
        marking: Marking,
    ) -> BoxFuture<'a, Result<Vec<i64>, sqlx::Error>> {
        Box::pin(async move {
            let mut tx = self.begin_write().await?;
            let conn: &mut sqlx::SqliteConnection = &mut tx;
            let result = async {
                if self.fenced(conn, relay_id, fences).await?.is_empty() {
                    return Ok(Vec::new());
                }
                let done = sqlx::query(&self.sql.mark_published)
                    .bind(serde_json::to_string(ids).expect("integers"))
                    .fetch_all(&mut *conn)
                    .await?;
                let marked = done
                    .iter()
                    .map(|row| row.try_get::<i64, _>(0))
                    .collect::<Result<Vec<_>, _>>()?;
                if marking == Marking::Streamed {
                    return Ok(marked);
                }
                // One statement for the batch: a statement per row cost more than the rest of
                // the claim and the mark together (89 µs of CPU per event at 1000 per batch).
                let released: Vec<(String, String)> = sqlx::query_as(&self.sql.release_holds)
                    .bind(serde_json::to_string(&marked).expect("integers"))
                    .fetch_all(&mut *conn)
                    .await?;
                for (aggregate_type, aggregate_id) in &released {
                    sqlx::query(&self.sql.resume)
                        .bind(aggregate_type)
                        .bind(aggregate_id)
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(marked)
            }
            .await;
            crate::db::finish(tx, result).await
        })
    }

    fn mark_failed<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        failures: &'a [Failure],
        park_on_dead: bool,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            let mut tx = self.begin_write().await?;
            let conn: &mut sqlx::SqliteConnection = &mut tx;
            let result = async {
                if self.fenced(conn, relay_id, fences).await?.is_empty() {
                    return Ok(0);
                }
                let now = self.now_ms(conn).await?;
                let mut n = 0;
                for f in failures {
                    let until = now + millis(f.backoff);
                    let row = sqlx::query(&self.sql.mark_failed)
                        .bind(f.id)
                        .bind(&f.error)
                        .bind(f.dead)
                        .bind(until)
                        .bind(i32::from(f.permanent))
                        .fetch_optional(&mut *conn)
                        .await?;
                    let Some(row) = row else { continue };
                    n += 1;
                    let (aggregate_type, aggregate_id, partition): (String, String, i32) =
                        (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
                    let parked: bool = sqlx::query_scalar(&self.sql.parked_elsewhere)
                        .bind(&aggregate_type)
                        .bind(&aggregate_id)
                        .bind(f.id)
                        .fetch_one(&mut *conn)
                        .await?;
                    // An aggregate parked on another dead event stays parked; this row waits
                    // for the park to end (see PostgreSQL's mark_failed.sql).
                    if f.dead && !park_on_dead && parked {
                        continue;
                    }
                    if f.dead && !park_on_dead {
                        sqlx::query(&self.sql.unhold)
                            .bind(&aggregate_type)
                            .bind(&aggregate_id)
                            .execute(&mut *conn)
                            .await?;
                        sqlx::query(&self.sql.resume)
                            .bind(&aggregate_type)
                            .bind(&aggregate_id)
                            .execute(&mut *conn)
                            .await?;
                        continue;
                    }
                    sqlx::query(&self.sql.wait_behind)
                        .bind(&aggregate_type)
                        .bind(&aggregate_id)
                        .bind(f.id)
                        .execute(&mut *conn)
                        .await?;
                    if parked {
                        continue;
                    }
                    sqlx::query(&self.sql.hold)
                        .bind(aggregate_type)
                        .bind(aggregate_id)
                        .bind(partition)
                        .bind(f.id)
                        .bind((!f.dead).then_some(until))
                        .bind(now)
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(n)
            }
            .await;
            crate::db::finish(tx, result).await
        })
    }

    fn release_stale(&self) -> BoxFuture<'_, Result<u64, sqlx::Error>> {
        Box::pin(async move {
            let mut tx = self.begin_write().await?;
            let conn: &mut sqlx::SqliteConnection = &mut tx;
            let result = async {
                let now = self.now_ms(conn).await?;
                sqlx::query(&self.sql.drop_stale_holds)
                    .bind(now)
                    .execute(&mut *conn)
                    .await?;
                sqlx::query(&self.sql.release_stale)
                    .execute(&mut *conn)
                    .await
                    .map(|done| done.rows_affected())
            }
            .await;
            crate::db::finish(tx, result).await
        })
    }

    fn backlog(&self) -> BoxFuture<'_, Result<Backlog, sqlx::Error>> {
        Box::pin(async move {
            let row = sqlx::query(&self.sql.backlog).fetch_one(&self.pool).await?;
            let waited: Option<i64> = row.try_get(1)?;
            Ok(Backlog {
                pending: row.try_get(0)?,
                oldest_age: waited.map(crate::store::waited),
                dead: row.try_get(2)?,
            })
        })
    }

    fn partition_status(&self) -> BoxFuture<'_, Result<Vec<PartitionStatus>, sqlx::Error>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await?;
            let now = self.now_ms(&mut conn).await?;
            let rows = sqlx::query(&self.sql.partitions)
                .bind(now)
                .fetch_all(&mut *conn)
                .await?;
            rows.iter()
                .map(|r| {
                    let waited: Option<i64> = r.try_get("oldest_wait_us")?;
                    Ok(PartitionStatus {
                        partition: r.try_get("partition")?,
                        owner: r.try_get("owner")?,
                        epoch: r.try_get("epoch")?,
                        live: r.try_get("live")?,
                        pending: r.try_get("pending")?,
                        oldest_age_seconds: waited.map(|w| crate::store::waited(w).as_secs_f64()),
                    })
                })
                .collect()
        })
    }
}
