//! MySQL 8 / MariaDB 10.6+ storage for the relay: partitions and leases with fencing epochs
//! as on PostgreSQL, so any number of relays share an outbox. MySQL has no `RETURNING`: each
//! write of event state runs in a transaction that first checks the lease under a share lock
//! (`held` in `sql/store.sql`), then reads the rows it changes with a locking read. Times in the
//! lease, relay and hold tables are unix milliseconds from the database's clock.

use std::{collections::HashMap, time::Duration};

use chrono::NaiveDateTime;
use futures::future::BoxFuture;
use outbox::{mysql::Session, sql::named, Tables};
use sqlx::{mysql::MySqlArguments, query::Query, MySql, MySqlConnection, MySqlPool, Row};
use uuid::Uuid;

use crate::{
    error::Error,
    store::{Backlog, Claimed, ClaimedRow, Failure, Fence, Marking, PartitionStatus, Store},
};

/// The database clock in unix milliseconds. Not `UNIX_TIMESTAMP()`, which MariaDB before 11.5
/// answers with NULL after 2038-01-19 03:14:07 UTC.
#[doc(hidden)]
pub const NOW_MS: &str = "CAST(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', \
     UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED)";

/// The UTC `DATETIME(6)` of a bound unix millisecond (not `FROM_UNIXTIME`, NULL past 2038 on
/// MariaDB before 11.5, and in the session's time zone).
#[doc(hidden)]
pub const DATETIME_OF_MS: &str =
    "TIMESTAMPADD(MICROSECOND, ? * 1000, TIMESTAMP'1970-01-01 00:00:00')";

/// The claim's cost of a row in memory (see `postgres/sql/claim_columns.sql`), without loading it.
const ROW_BYTES: &str = "(CASE WHEN e.payload_bytes <= ? THEN e.payload_bytes ELSE 0 END \
     + LEAST(e.headers_bytes, 65536) + LENGTH(e.aggregate_type) + LENGTH(e.aggregate_id) \
     + LENGTH(e.event_type) + LENGTH(e.content_type) + COALESCE(LENGTH(e.destination), 0))";

#[derive(Debug)]
struct Sql {
    file: String,
}

impl Sql {
    fn get(&self, name: &str) -> &str {
        named(&self.file, name)
    }

    fn listed(&self, name: &str, lists: &[(&str, usize)]) -> String {
        listed(self.get(name), lists)
    }
}

/// `sql` with each `{key}` of `lists` replaced by the placeholders of `n` values (padded,
/// see [`slots`]).
pub(crate) fn listed(sql: &str, lists: &[(&str, usize)]) -> String {
    let mut sql = sql.to_owned();
    for (key, n) in lists {
        sql = sql.replace(&format!("{{{key}}}"), &vec!["?"; slots(*n)].join(", "));
    }
    sql
}

/// Placeholders for `n` values: the next power of two, so that a few prepared statements (one
/// per size) serve every batch; the list is padded with its last value.
fn slots(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// Binds `values`, padded to [`slots`] with the last one (an `IN` list means the same).
pub(crate) fn bind_list<'q, Q, T>(mut query: Q, values: &[T]) -> Q
where
    Q: BindOne<'q, T>,
    T: Copy + Send + sqlx::Encode<'q, MySql> + sqlx::Type<MySql> + 'q,
{
    let last = *values.last().expect("a non-empty list");
    for value in values {
        query = query.bind_one(*value);
    }
    for _ in values.len()..slots(values.len()) {
        query = query.bind_one(last);
    }
    query
}

/// The queries [`bind_list`] binds to: `query` and `query_scalar`.
pub(crate) trait BindOne<'q, T> {
    /// The query with `value` bound next.
    fn bind_one(self, value: T) -> Self;
}

impl<'q, T> BindOne<'q, T> for Query<'q, MySql, MySqlArguments>
where
    T: Send + sqlx::Encode<'q, MySql> + sqlx::Type<MySql> + 'q,
{
    fn bind_one(self, value: T) -> Self {
        self.bind(value)
    }
}

impl<'q, O, T> BindOne<'q, T> for sqlx::query::QueryScalar<'q, MySql, O, MySqlArguments>
where
    T: Send + sqlx::Encode<'q, MySql> + sqlx::Type<MySql> + 'q,
{
    fn bind_one(self, value: T) -> Self {
        self.bind(value)
    }
}

/// The relay's handle on a MySQL or MariaDB outbox.
#[derive(Clone, Debug)]
pub struct MySqlStore {
    pool: MySqlPool,
    /// A pool of its own for the lease statements, as `PgStore`'s.
    lease_pool: MySqlPool,
    partitions: i32,
    sql: std::sync::Arc<Sql>,
}

impl MySqlStore {
    /// Opens the outbox at `tables` (migrated with `outbox::mysql::MySqlOutbox::migrate`),
    /// its connections set to the default [`Session`].
    pub async fn open(pool: MySqlPool, tables: &Tables) -> Result<Self, Error> {
        Self::open_with(pool, tables, Session::default()).await
    }

    /// Opens the outbox at `tables` on connections of its own, opened with `pool`'s connect
    /// options and size and set to `session` (READ COMMITTED, autocommit, the timeouts): the
    /// server's defaults never decide how the relay locks.
    pub async fn open_with(
        pool: MySqlPool,
        tables: &Tables,
        session: Session,
    ) -> Result<Self, Error> {
        let lease_pool = session.pool_of(&pool, 2);
        let pool = session.pool(&pool);
        let file = tables
            .render_mysql(include_str!("sql/store.sql"))
            .replace("{row_bytes}", ROW_BYTES)
            .replace("{now_ms}", NOW_MS)
            .replace("{datetime_of_ms}", DATETIME_OF_MS);
        let meta = tables.render_mysql("SELECT partitions FROM {meta} WHERE singleton = 1");
        let partitions: i32 = sqlx::query_scalar(&meta)
            .fetch_optional(&pool)
            .await
            .map_err(|e| match outbox::mysql::error_number(&e) {
                Some(1146) => Error::Outbox(outbox::Error::Schema(outbox::SchemaError::Missing)),
                _ => Error::Database(e),
            })?
            .ok_or(Error::Outbox(outbox::Error::Schema(
                outbox::SchemaError::Missing,
            )))?;
        let applied: Option<i32> =
            sqlx::query_scalar(&tables.render_mysql("SELECT max(version) FROM {migrations}"))
                .fetch_one(&pool)
                .await?;
        outbox::require_migrated(applied, outbox::mysql::MIGRATIONS)?;
        Ok(Self {
            pool,
            lease_pool,
            partitions,
            sql: std::sync::Arc::new(Sql { file }),
        })
    }

    /// The connection pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The claim's scan for `partitions` partitions (see `claim_scan` in `sql/store.sql`), for
    /// `EXPLAIN` in tests: per partition (padded, see [`slots`]) its floor twice, the max
    /// payload, the partition, its floor and the limit; then the limit, the max payload, the
    /// partitions, now (ms) and the limit.
    #[doc(hidden)]
    pub fn claim_statement(&self, partitions: usize) -> String {
        let arm = self.sql.get("claim_arm").trim_end().trim_end_matches(';');
        let arms = vec![arm; slots(partitions)].join("\n    UNION ALL\n    ");
        self.sql
            .listed("claim_scan", &[("partitions", partitions)])
            .replace("{scan_arms}", &arms)
    }

    /// The statements of [`Store::acquire`] on `conn`, inside the caller's transaction (for
    /// tests that hold it open, as a relay frozen half-way would): the free leases are found
    /// without a lock, then locked by primary key, so live leases are never locked.
    #[doc(hidden)]
    pub async fn acquire_on(
        &self,
        conn: &mut MySqlConnection,
        relay_id: &str,
        n: i64,
        ttl: Duration,
    ) -> Result<Vec<Fence>, sqlx::Error> {
        let now = self.now_ms(conn).await?;
        let found: Vec<i32> = sqlx::query_scalar(self.sql.get("free_leases"))
            .bind(now)
            .fetch_all(&mut *conn)
            .await?;
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self
            .sql
            .listed("take_leases", &[("partitions", found.len())]);
        let free: Vec<i32> = bind_list(sqlx::query_scalar(&sql), &found)
            .bind(now)
            .bind(n)
            .fetch_all(&mut *conn)
            .await?;
        if free.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self.sql.listed("acquire", &[("partitions", free.len())]);
        bind_list(
            sqlx::query(&sql)
                .bind(relay_id)
                .bind(now.saturating_add(millis(ttl)))
                .bind(now),
            &free,
        )
        .execute(&mut *conn)
        .await?;
        let sql = self.sql.listed("acquired", &[("partitions", free.len())]);
        bind_list(sqlx::query(&sql), &free)
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    async fn now_ms(&self, conn: &mut MySqlConnection) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(self.sql.get("now_ms"))
            .fetch_one(conn)
            .await
    }

    /// The partitions of `fences` this relay still holds, share-locked until the end of the
    /// transaction, in partition order (the one lock order of lease rows, see [`in_order`]).
    async fn fenced(
        &self,
        conn: &mut MySqlConnection,
        relay_id: &str,
        fences: &[Fence],
    ) -> Result<Vec<i32>, sqlx::Error> {
        let mut held = Vec::new();
        for (partition, epoch) in in_order(fences) {
            let found: Option<i32> = sqlx::query_scalar(self.sql.get("held"))
                .bind(partition)
                .bind(epoch)
                .bind(relay_id)
                .fetch_optional(&mut *conn)
                .await?;
            held.extend(found);
        }
        Ok(held)
    }

    /// Sets waiting the rows a claim met behind a hold that is still there.
    async fn set_behind_waiting(&self, behind: &[i64]) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let result = async {
            let sql = self.sql.listed("behind_held", &[("ids", behind.len())]);
            let held: Vec<i64> = bind_list(sqlx::query(&sql), behind)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?;
            if held.is_empty() {
                return Ok(());
            }
            let sql = self.sql.listed("set_waiting", &[("ids", held.len())]);
            bind_list(sqlx::query(&sql), &held)
                .execute(&mut *tx)
                .await
                .map(drop)
        }
        .await;
        crate::db::finish(tx, result).await
    }

    /// Sets free the rows waiting behind the hold of each aggregate, and drops the hold.
    async fn unhold(
        &self,
        conn: &mut MySqlConnection,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(self.sql.get("unhold"))
            .bind(aggregate_type)
            .bind(aggregate_id)
            .execute(&mut *conn)
            .await?;
        self.resume(conn, aggregate_type, aggregate_id).await
    }

    async fn resume(
        &self,
        conn: &mut MySqlConnection,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(self.sql.get("resume"))
            .bind(aggregate_type)
            .bind(aggregate_id)
            .execute(&mut *conn)
            .await
            .map(drop)
    }
}

/// `fences` in partition order: every statement that locks lease rows (a mark's fence, a
/// renewal, a release, an acquire) locks them in this order, so two of them never wait on each
/// other in a cycle (a deadlock whose victim, a renewal, would cost the relay its leases).
fn in_order(fences: &[Fence]) -> Vec<Fence> {
    let mut sorted = fences.to_vec();
    sorted.sort_unstable();
    sorted
}

/// A text column of the binary collation (the aggregate keys compare byte for byte): MySQL
/// sends it flagged as binary, so it is read as bytes, which must be UTF-8.
pub(crate) fn key_text<I>(row: &sqlx::mysql::MySqlRow, column: I) -> Result<String, sqlx::Error>
where
    I: sqlx::ColumnIndex<sqlx::mysql::MySqlRow> + std::fmt::Debug + Copy,
{
    let bytes: Vec<u8> = row.try_get(column)?;
    String::from_utf8(bytes).map_err(|e| sqlx::Error::ColumnDecode {
        index: format!("{column:?}"),
        source: Box::new(e),
    })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A claimed MySQL row. The table's types bound every column but the event id, which is text
/// a writer may fill with anything: an id that is not a UUID in its canonical spelling makes
/// the row unreadable (dead-lettered with the reason), never a stand-in value.
fn claimed(row: &sqlx::mysql::MySqlRow, row_bytes: i64) -> Result<ClaimedRow, sqlx::Error> {
    let event_id: String = row.try_get("event_id")?;
    let parsed_id = Uuid::parse_str(&event_id);
    let unreadable: Option<String> = row.try_get("unreadable")?;
    let shown = || event_id.chars().take(64).collect::<String>();
    let unreadable = unreadable.or_else(|| match &parsed_id {
        Err(e) => Some(format!("event_id {:?} is not a UUID: {e}", shown())),
        // The column is text: one UUID could be written twice under two spellings (without
        // hyphens, in braces) and pass the unique key as two events. Letter case cannot
        // (the column's collation ignores it), so capitals are read as the same UUID.
        Ok(id) if !id.hyphenated().to_string().eq_ignore_ascii_case(&event_id) => Some(format!(
            "event_id {:?} is not a UUID in its one spelling (hyphenated: {id})",
            shown()
        )),
        Ok(_) => None,
    });
    let occurred_at: NaiveDateTime = row.try_get("occurred_at")?;
    Ok(ClaimedRow {
        id: row.try_get("id")?,
        event_id: parsed_id.unwrap_or_default(),
        aggregate_type: key_text(row, "aggregate_type")?,
        aggregate_id: key_text(row, "aggregate_id")?,
        aggregate_version: row.try_get("aggregate_version")?,
        event_type: row.try_get("event_type")?,
        schema_version: row.try_get("schema_version")?,
        destination: row.try_get("destination")?,
        payload: row
            .try_get::<Option<Vec<u8>>, _>("payload")?
            .map(Into::into),
        payload_size: row.try_get("payload_size")?,
        content_type: row.try_get("content_type")?,
        headers: row.try_get("headers")?,
        unreadable,
        occurred_at: Some(occurred_at.and_utc()),
        partition: row.try_get("partition")?,
        attempts: row.try_get("attempts")?,
        permanent_failures: row.try_get("permanent_failures")?,
        row_bytes,
    })
}

impl Store for MySqlStore {
    fn partitions(&self) -> i32 {
        self.partitions
    }

    fn heartbeat<'a>(
        &'a self,
        relay_id: &'a str,
        hostname: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<String>, sqlx::Error>> {
        Box::pin(async move {
            let mut conn = self.lease_pool.acquire().await?;
            let now = self.now_ms(&mut conn).await?;
            sqlx::query(self.sql.get("register"))
                .bind(relay_id)
                .bind(hostname)
                .bind(now)
                .bind(now)
                .execute(&mut *conn)
                .await?;
            sqlx::query(self.sql.get("forget_dead_relays"))
                .bind(now.saturating_sub(10 * millis(ttl)))
                .execute(&mut *conn)
                .await?;
            sqlx::query_scalar(self.sql.get("live_relays"))
                .bind(now.saturating_sub(millis(ttl)))
                .fetch_all(&mut *conn)
                .await
        })
    }

    fn deregister<'a>(&'a self, relay_id: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query(self.sql.get("deregister"))
                .bind(relay_id)
                .execute(&self.lease_pool)
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
            let mut tx = self.lease_pool.begin().await?;
            let result = async {
                let now = self.now_ms(&mut tx).await?;
                let mut still = Vec::new();
                for (partition, epoch) in in_order(held) {
                    let done = sqlx::query(self.sql.get("renew"))
                        .bind(now.saturating_add(millis(ttl)))
                        .bind(partition)
                        .bind(epoch)
                        .bind(relay_id)
                        .execute(&mut *tx)
                        .await?;
                    if done.rows_affected() == 1 {
                        still.push(partition);
                    }
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
            if n <= 0 {
                return Ok(Vec::new());
            }
            let mut tx = self.lease_pool.begin().await?;
            let result = self.acquire_on(&mut tx, relay_id, n, ttl).await;
            crate::db::finish(tx, result).await
        })
    }

    fn release<'a>(
        &'a self,
        relay_id: &'a str,
        leases: &'a [Fence],
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            for (partition, epoch) in in_order(leases) {
                sqlx::query(self.sql.get("release"))
                    .bind(partition)
                    .bind(epoch)
                    .bind(relay_id)
                    .execute(&self.lease_pool)
                    .await?;
            }
            Ok(())
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
            if partitions.is_empty() {
                return Ok(Claimed::default());
            }
            let parts: Vec<i32> = partitions.iter().map(|p| p.0).collect();
            let max_payload = i64::try_from(max_payload_bytes).unwrap_or(i64::MAX);
            let mut conn = self.pool.acquire().await?;
            let now = self.now_ms(&mut conn).await?;
            let sql = self.claim_statement(parts.len());
            let mut scan = sqlx::query(&sql);
            // One arm per partition from its floor; the padding arms scan partition -1 (none).
            let padding = slots(partitions.len()) - partitions.len();
            for &(partition, floor) in partitions.iter().chain(vec![(-1, 0); padding].iter()) {
                scan = scan
                    .bind(floor)
                    .bind(floor)
                    .bind(max_payload)
                    .bind(partition)
                    .bind(floor)
                    .bind(limit);
            }
            let scanned = bind_list(scan.bind(limit).bind(max_payload), &parts)
                .bind(now)
                .bind(limit)
                .fetch_all(&mut *conn)
                .await?;
            // The byte budget, as PostgreSQL's claim cuts it: rows in claim order while the
            // bytes of the rows before them stay under the budget (the first row always).
            let mut behind = Vec::new();
            let mut kept: HashMap<i64, i64> = HashMap::new();
            let mut running = 0_i64;
            for row in &scanned {
                let id: i64 = row.try_get(0)?;
                if row.try_get::<i64, _>(1)? != 0 {
                    behind.push(id);
                } else if running < byte_budget.max(1) {
                    let bytes: i64 = row.try_get(2)?;
                    running = running.saturating_add(bytes);
                    kept.insert(id, bytes);
                }
            }
            let mut rows = Vec::with_capacity(kept.len());
            if !kept.is_empty() {
                let mut ids: Vec<i64> = kept.keys().copied().collect();
                ids.sort_unstable();
                let sql = self.sql.listed("claim_rows", &[("ids", ids.len())]);
                let read = bind_list(sqlx::query(&sql).bind(max_payload), &ids)
                    .fetch_all(&mut *conn)
                    .await?;
                for row in &read {
                    let bytes = kept[&row.try_get::<i64, _>("id")?];
                    rows.push(
                        claimed(row, bytes)
                            .or_else(|error| ClaimedRow::unreadable_row(row, &error))?,
                    );
                }
            }
            drop(conn);
            if !behind.is_empty() {
                // Met once: set waiting, so that later claims do not walk them again.
                self.set_behind_waiting(&behind).await?;
            }
            // More met than returned (rows set waiting included): more work may wait.
            Ok(Claimed {
                cut: scanned.len() > rows.len(),
                rows,
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
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let mut tx = self.pool.begin().await?;
            let result = async {
                let held = self.fenced(&mut tx, relay_id, fences).await?;
                if held.is_empty() {
                    return Ok(Vec::new());
                }
                let sql = self.sql.listed(
                    "pending_of",
                    &[("ids", ids.len()), ("partitions", held.len())],
                );
                let marked: Vec<i64> = bind_list(bind_list(sqlx::query(&sql), ids), &held)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| r.try_get(0))
                    .collect::<Result<_, _>>()?;
                if marked.is_empty() {
                    return Ok(marked);
                }
                let sql = self.sql.listed("mark_published", &[("ids", marked.len())]);
                bind_list(sqlx::query(&sql), &marked)
                    .execute(&mut *tx)
                    .await?;
                if marking == Marking::Streamed {
                    return Ok(marked);
                }
                let sql = self.sql.listed("holds_on", &[("ids", marked.len())]);
                let released: Vec<(String, String)> = bind_list(sqlx::query(&sql), &marked)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| Ok((key_text(r, 0)?, key_text(r, 1)?)))
                    .collect::<Result<_, sqlx::Error>>()?;
                for (aggregate_type, aggregate_id) in &released {
                    self.unhold(&mut tx, aggregate_type, aggregate_id).await?;
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
            if failures.is_empty() {
                return Ok(0);
            }
            let mut tx = self.pool.begin().await?;
            let result = async {
                let held = self.fenced(&mut tx, relay_id, fences).await?;
                if held.is_empty() {
                    return Ok(0);
                }
                let now = self.now_ms(&mut tx).await?;
                let ids: Vec<i64> = failures.iter().map(|f| f.id).collect();
                let sql = self.sql.listed(
                    "pending_of",
                    &[("ids", ids.len()), ("partitions", held.len())],
                );
                let pending: HashMap<i64, (String, String, i32)> =
                    bind_list(bind_list(sqlx::query(&sql), &ids), &held)
                        .fetch_all(&mut *tx)
                        .await?
                        .iter()
                        .map(|r| {
                            Ok((
                                r.try_get(0)?,
                                (key_text(r, 1)?, key_text(r, 2)?, r.try_get(3)?),
                            ))
                        })
                        .collect::<Result<_, sqlx::Error>>()?;
                let mut n = 0;
                for f in failures {
                    let Some((aggregate_type, aggregate_id, partition)) = pending.get(&f.id) else {
                        continue;
                    };
                    let until = now.saturating_add(millis(f.backoff));
                    sqlx::query(self.sql.get("mark_failed"))
                        .bind(i32::from(f.permanent))
                        .bind(&f.error)
                        .bind(f.dead)
                        .bind(f.dead)
                        .bind(until)
                        .bind(f.id)
                        .execute(&mut *tx)
                        .await?;
                    n += 1;
                    let parked: bool = sqlx::query_scalar(self.sql.get("parked_elsewhere"))
                        .bind(aggregate_type)
                        .bind(aggregate_id)
                        .bind(f.id)
                        .fetch_one(&mut *tx)
                        .await?;
                    // An aggregate parked on another dead event stays parked; this row waits
                    // for the park to end (see PostgreSQL's mark_failed.sql).
                    if f.dead && !park_on_dead {
                        if !parked {
                            self.unhold(&mut tx, aggregate_type, aggregate_id).await?;
                        }
                        continue;
                    }
                    sqlx::query(self.sql.get("wait_behind"))
                        .bind(aggregate_type)
                        .bind(aggregate_id)
                        .bind(f.id)
                        .execute(&mut *tx)
                        .await?;
                    if parked {
                        continue;
                    }
                    sqlx::query(self.sql.get("hold"))
                        .bind(aggregate_type)
                        .bind(aggregate_id)
                        .bind(partition)
                        .bind(f.id)
                        .bind((!f.dead).then_some(until))
                        .bind(now)
                        .execute(&mut *tx)
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
            let mut tx = self.pool.begin().await?;
            let result = async {
                let now = self.now_ms(&mut tx).await?;
                sqlx::query(self.sql.get("drop_stale_holds"))
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(self.sql.get("release_stale"))
                    .execute(&mut *tx)
                    .await
                    .map(|done| done.rows_affected())
            }
            .await;
            crate::db::finish(tx, result).await
        })
    }

    fn backlog(&self) -> BoxFuture<'_, Result<Backlog, sqlx::Error>> {
        Box::pin(async move {
            let row = sqlx::query(self.sql.get("backlog"))
                .fetch_one(&self.pool)
                .await?;
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
            let rows = sqlx::query(self.sql.get("partitions"))
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
                        live: r.try_get::<i64, _>("live")? != 0,
                        pending: r.try_get("pending")?,
                        oldest_age_seconds: waited.map(|w| crate::store::waited(w).as_secs_f64()),
                    })
                })
                .collect()
        })
    }
}
