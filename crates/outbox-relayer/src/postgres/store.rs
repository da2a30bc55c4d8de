//! The relay's store on PostgreSQL: the SQL lives in `sql/*.sql`, rendered once with the
//! validated schema and table names; every value is a bind parameter.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use outbox::{sql::named, Tables};
use sqlx::{postgres::PgPoolOptions, PgPool, Row};

use super::rows::Columns;
use crate::{
    error::Error,
    store::{Backlog, Claimed, ClaimedRow, Failure, Fence, Marking, PartitionStatus, Store},
};

/// Statements, rendered for one outbox.
#[derive(Debug)]
struct Sql {
    claim: String,
    mark_published: String,
    mark_failed: String,
    register: String,
    live_relays: String,
    forget_dead_relays: String,
    deregister: String,
    renew: String,
    acquire: String,
    acquire_all: String,
    release: String,
    backlog: String,
    partitions: String,
    modifications: String,
    analyze: String,
    release_stale: String,
}

impl Sql {
    fn new(tables: &Tables) -> Self {
        let render = |text: &str| render_fenced(tables, text);
        let leases = include_str!("sql/leases.sql");
        let stats = include_str!("sql/stats.sql");
        Self {
            claim: render(include_str!("sql/claim.sql")),
            mark_published: render(include_str!("sql/mark_published.sql")),
            mark_failed: render(include_str!("sql/mark_failed.sql")),
            register: render(named(leases, "register")),
            live_relays: render(named(leases, "live_relays")),
            forget_dead_relays: render(named(leases, "forget_dead_relays")),
            deregister: render(named(leases, "deregister")),
            renew: render(named(leases, "renew")),
            acquire: render(named(leases, "acquire")),
            acquire_all: render(named(leases, "acquire_all")),
            release: render(named(leases, "release")),
            backlog: render(named(stats, "backlog")),
            partitions: render(named(stats, "partitions")),
            modifications: render(named(stats, "modifications")),
            analyze: render(named(stats, "analyze")),
            release_stale: render(named(include_str!("sql/waiting.sql"), "release_stale")),
        }
    }
}

/// Renders a statement for `tables`, with the lease fence (`sql/fence.sql`) in place of
/// `{fence}` and the claimed columns (`sql/claim_columns.sql`) in place of
/// `{claim_columns:$N}`.
pub(crate) fn render_fenced(tables: &Tables, text: &str) -> String {
    let fragment = |sql: &str| {
        sql.lines()
            .filter(|l| !l.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n    ")
    };
    let mut text = text.replace("{fence}", &fragment(include_str!("sql/fence.sql")));
    let columns = fragment(include_str!("sql/claim_columns.sql"));
    for n in 1..=9 {
        text = text.replace(
            &format!("{{claim_columns:${n}}}"),
            &columns.replace("{max_payload}", &format!("${n}")),
        );
    }
    tables.render(&text)
}

/// The relay's handle on the outbox tables.
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
    /// A pool of its own for the lease statements (heartbeat, renew, acquire, release): claims,
    /// marks, purges and statistics that hold every connection of `pool` must not delay a
    /// renewal past the lease's expiry.
    lease_pool: PgPool,
    tables: Tables,
    partitions: i32,
    sql: std::sync::Arc<Sql>,
}

impl PgStore {
    /// Opens the outbox at `tables`, checking that it was migrated.
    pub async fn open(pool: PgPool, tables: &Tables) -> Result<Self, Error> {
        let partitions: Option<i32> =
            sqlx::query_scalar(&tables.render("SELECT partitions FROM {schema}.meta"))
                .fetch_optional(&pool)
                .await
                .map_err(|e| match e.as_database_error().and_then(|d| d.code()) {
                    Some(code) if code == "42P01" || code == "3F000" => {
                        Error::Outbox(outbox::Error::Schema(outbox::SchemaError::Missing))
                    }
                    _ => Error::Database(e),
                })?;
        let partitions = partitions.ok_or(Error::Outbox(outbox::Error::Schema(
            outbox::SchemaError::Missing,
        )))?;
        let applied: Option<i32> =
            sqlx::query_scalar(&tables.render("SELECT max(version) FROM {schema}.migrations"))
                .fetch_one(&pool)
                .await?;
        outbox::require_migrated(applied, outbox::postgres::MIGRATIONS)?;
        Ok(Self {
            lease_pool: derived_pool(&pool, 2),
            pool,
            tables: tables.clone(),
            partitions,
            sql: std::sync::Arc::new(Sql::new(tables)),
        })
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The rendered claim statement (its parameters: partitions, batch size, max payload
    /// bytes, floors, byte budget), for `EXPLAIN` in tests and benchmarks.
    #[doc(hidden)]
    pub fn claim_statement(&self) -> &str {
        &self.sql.claim
    }

    /// The rendered statement that marks events published (its parameters: ids, partitions,
    /// epochs, relay id), for `EXPLAIN` in tests and benchmarks.
    #[doc(hidden)]
    pub fn mark_published_statement(&self) -> &str {
        &self.sql.mark_published
    }

    /// The partition count fixed at migration.
    pub fn partitions(&self) -> i32 {
        self.partitions
    }

    /// Records this relay as alive and returns the ids of all live relays, sorted.
    pub async fn heartbeat(
        &self,
        relay_id: &str,
        hostname: &str,
        ttl: Duration,
    ) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query(&self.sql.register)
            .bind(relay_id)
            .bind(hostname)
            .execute(&self.lease_pool)
            .await?;
        sqlx::query(&self.sql.forget_dead_relays)
            .bind(ttl.as_secs_f64())
            .execute(&self.lease_pool)
            .await?;
        sqlx::query_scalar(&self.sql.live_relays)
            .bind(ttl.as_secs_f64())
            .fetch_all(&self.lease_pool)
            .await
    }

    /// Removes this relay from the live set (clean shutdown).
    pub async fn deregister(&self, relay_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query(&self.sql.deregister)
            .bind(relay_id)
            .execute(&self.lease_pool)
            .await
            .map(drop)
    }

    /// Extends the given leases; returns the partitions still held.
    pub async fn renew(
        &self,
        relay_id: &str,
        held: &[Fence],
        ttl: Duration,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let (parts, epochs) = split(held);
        sqlx::query_scalar(&self.sql.renew)
            .bind(parts)
            .bind(epochs)
            .bind(relay_id)
            .bind(ttl.as_secs_f64())
            .fetch_all(&self.lease_pool)
            .await
    }

    /// Takes up to `n` free or expired partitions, bumping their epoch.
    pub async fn acquire(
        &self,
        relay_id: &str,
        n: i64,
        ttl: Duration,
    ) -> Result<Vec<Fence>, sqlx::Error> {
        let rows = sqlx::query(&self.sql.acquire)
            .bind(n)
            .bind(relay_id)
            .bind(ttl.as_secs_f64())
            .fetch_all(&self.lease_pool)
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Gives leases back so another relay can take them at once.
    pub async fn release(&self, relay_id: &str, leases: &[Fence]) -> Result<(), sqlx::Error> {
        let (parts, epochs) = split(leases);
        sqlx::query(&self.sql.release)
            .bind(parts)
            .bind(epochs)
            .bind(relay_id)
            .execute(&self.lease_pool)
            .await
            .map(drop)
    }

    /// Reads up to `limit` pending rows from `partitions` (visited in that order), each from its
    /// floor id, within `byte_budget`.
    pub async fn claim(
        &self,
        partitions: &[(i32, i64)],
        limit: i64,
        max_payload_bytes: usize,
        byte_budget: i64,
    ) -> Result<Claimed, sqlx::Error> {
        use futures::TryStreamExt;
        let (parts, floors): (Vec<i32>, Vec<i64>) = partitions.iter().copied().unzip();
        let mut stream = sqlx::query(&self.sql.claim)
            .bind(parts)
            .bind(limit)
            .bind(i32::try_from(max_payload_bytes).unwrap_or(i32::MAX))
            .bind(floors)
            .bind(byte_budget.max(1))
            .fetch(&self.pool);
        // Each row is read as it arrives (no vector of raw rows first), the columns' positions
        // found on the first.
        let mut rows = Vec::with_capacity(usize::try_from(limit).unwrap_or(0).min(10_000));
        let mut found = 0i64;
        let mut at = None;
        while let Some(row) = stream.try_next().await? {
            let columns = match &mut at {
                Some(columns) => columns,
                None => {
                    found = row.try_get("found")?;
                    at.insert(Columns::of(&row)?)
                }
            };
            rows.push(ClaimedRow::read_at(&row, columns)?);
        }
        let cut = found > rows.len() as i64;
        Ok(Claimed { rows, cut })
    }

    /// Marks acknowledged events published, if this relay still holds their leases. Returns
    /// the ids settled (see [`Marking`]).
    pub async fn mark_published(
        &self,
        relay_id: &str,
        fences: &[Fence],
        ids: &[i64],
        marking: Marking,
    ) -> Result<Vec<i64>, sqlx::Error> {
        let (parts, epochs) = split(fences);
        sqlx::query_scalar(&self.sql.mark_published)
            .bind(ids)
            .bind(parts)
            .bind(epochs)
            .bind(relay_id)
            .bind(marking == Marking::Claimed)
            .fetch_all(&self.pool)
            .await
    }

    /// Records failed attempts (retry or dead letter), if this relay still holds their leases.
    pub async fn mark_failed(
        &self,
        relay_id: &str,
        fences: &[Fence],
        failures: &[Failure],
        park_on_dead: bool,
    ) -> Result<i64, sqlx::Error> {
        let (parts, epochs) = split(fences);
        let ids: Vec<i64> = failures.iter().map(|f| f.id).collect();
        let errors: Vec<&str> = failures.iter().map(|f| f.error.as_str()).collect();
        let backoff: Vec<f64> = failures.iter().map(|f| f.backoff.as_secs_f64()).collect();
        let dead: Vec<bool> = failures.iter().map(|f| f.dead).collect();
        let permanent: Vec<bool> = failures.iter().map(|f| f.permanent).collect();
        sqlx::query_scalar(&self.sql.mark_failed)
            .bind(ids)
            .bind(parts)
            .bind(epochs)
            .bind(relay_id)
            .bind(errors)
            .bind(backoff)
            .bind(dead)
            .bind(park_on_dead)
            .bind(permanent)
            .fetch_one(&self.pool)
            .await
    }

    /// Pending count, oldest pending age and dead count.
    pub async fn backlog(&self) -> Result<Backlog, sqlx::Error> {
        let row = sqlx::query(&self.sql.backlog).fetch_one(&self.pool).await?;
        let oldest: Option<DateTime<Utc>> = row.get("oldest");
        let now: DateTime<Utc> = row.get("now");
        Ok(Backlog {
            pending: row.get("pending"),
            oldest_age: oldest.map(|o| (now - o).to_std().unwrap_or_default()),
            dead: row.get("dead"),
        })
    }

    /// Refreshes the planner statistics of the events table when it changed a lot since they
    /// were last gathered (more than 10% of its rows and at least 10,000, and 30 s ago or
    /// never), whether or not autovacuum runs. A queue table whose statistics predate a large
    /// backlog makes PostgreSQL scan it in id order instead of using the pending index: the
    /// claim then reads every published row first. Returns whether it analyzed.
    pub async fn refresh_statistics(&self) -> Result<bool, sqlx::Error> {
        let row: Option<(i64, i64, Option<f64>)> = sqlx::query_as(&self.sql.modifications)
            .bind(self.tables.schema().as_str())
            .bind(self.tables.events().as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some((modified, live, age)) = row else {
            return Ok(false);
        };
        let stale = modified >= 10_000 && modified * 10 >= live && age.is_none_or(|a| a > 30.0);
        if !stale {
            return Ok(false);
        }
        // One relay analyzes at a time; the others skip.
        let mut tx = self.pool.begin().await?;
        let locked: bool = sqlx::query_scalar(
            "SELECT pg_try_advisory_xact_lock(hashtextextended('outbox.analyze.' || $1, 0))",
        )
        .bind(self.tables.schema().as_str())
        .fetch_one(&mut *tx)
        .await?;
        if locked {
            sqlx::query(&self.sql.analyze).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(locked)
    }

    /// Every partition with its owner and backlog.
    pub async fn partition_status(&self) -> Result<Vec<PartitionStatus>, sqlx::Error> {
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&self.pool)
            .await?;
        let rows = sqlx::query(&self.sql.partitions)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let oldest: Option<DateTime<Utc>> = r.get("oldest");
                PartitionStatus {
                    partition: r.get("partition"),
                    owner: r.get("owner"),
                    epoch: r.get("epoch"),
                    live: r.get("live"),
                    pending: r.get("pending"),
                    oldest_age_seconds: oldest
                        .map(|o| (now - o).num_microseconds().unwrap_or(0) as f64 / 1e6),
                }
            })
            .collect())
    }
}

impl Store for PgStore {
    fn partitions(&self) -> i32 {
        self.partitions
    }
    fn heartbeat<'a>(
        &'a self,
        relay_id: &'a str,
        hostname: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<String>, sqlx::Error>> {
        Box::pin(PgStore::heartbeat(self, relay_id, hostname, ttl))
    }
    fn deregister<'a>(&'a self, relay_id: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(PgStore::deregister(self, relay_id))
    }
    fn renew<'a>(
        &'a self,
        relay_id: &'a str,
        held: &'a [Fence],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<i32>, sqlx::Error>> {
        Box::pin(PgStore::renew(self, relay_id, held, ttl))
    }
    fn acquire<'a>(
        &'a self,
        relay_id: &'a str,
        n: i64,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Fence>, sqlx::Error>> {
        Box::pin(PgStore::acquire(self, relay_id, n, ttl))
    }
    fn release<'a>(
        &'a self,
        relay_id: &'a str,
        leases: &'a [Fence],
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(PgStore::release(self, relay_id, leases))
    }
    fn acquire_all<'a>(
        &'a self,
        relay_id: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Fence>, sqlx::Error>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql.acquire_all)
                .bind(relay_id)
                .bind(ttl.as_secs_f64())
                .fetch_all(&self.lease_pool)
                .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }
    fn claim<'a>(
        &'a self,
        partitions: &'a [(i32, i64)],
        limit: i64,
        max_payload_bytes: usize,
        byte_budget: i64,
    ) -> BoxFuture<'a, Result<Claimed, sqlx::Error>> {
        Box::pin(PgStore::claim(
            self,
            partitions,
            limit,
            max_payload_bytes,
            byte_budget,
        ))
    }
    fn mark_published<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        ids: &'a [i64],
        marking: Marking,
    ) -> BoxFuture<'a, Result<Vec<i64>, sqlx::Error>> {
        Box::pin(PgStore::mark_published(
            self, relay_id, fences, ids, marking,
        ))
    }
    fn mark_failed<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        failures: &'a [Failure],
        park_on_dead: bool,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(PgStore::mark_failed(
            self,
            relay_id,
            fences,
            failures,
            park_on_dead,
        ))
    }
    fn backlog(&self) -> BoxFuture<'_, Result<Backlog, sqlx::Error>> {
        Box::pin(PgStore::backlog(self))
    }
    fn partition_status(&self) -> BoxFuture<'_, Result<Vec<PartitionStatus>, sqlx::Error>> {
        Box::pin(PgStore::partition_status(self))
    }
    fn refresh_statistics(&self) -> BoxFuture<'_, Result<bool, sqlx::Error>> {
        Box::pin(PgStore::refresh_statistics(self))
    }
    fn release_stale(&self) -> BoxFuture<'_, Result<u64, sqlx::Error>> {
        Box::pin(async move {
            let n: i64 = sqlx::query_scalar(&self.sql.release_stale)
                .fetch_one(&self.pool)
                .await?;
            Ok(n as u64)
        })
    }
    fn notifications(
        &self,
        wake: std::sync::Arc<tokio::sync::Notify>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Option<BoxFuture<'static, ()>> {
        // A connection of its own: a listener holds its connection for as long as it listens,
        // and must not take one of the pool's (a pool of one would have none left to claim).
        Some(Box::pin(listen(
            derived_pool(&self.pool, 1),
            self.tables.channel(),
            wake,
            shutdown,
        )))
    }
}

/// Wakes the relay on NOTIFY; reconnects with backoff when the connection drops. Missed
/// notifications only delay work until the fallback poll.
async fn listen(
    pool: PgPool,
    channel: String,
    wake: std::sync::Arc<tokio::sync::Notify>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut backoff =
        outbox::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    loop {
        let attempt = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
            loop {
                listener.recv().await?;
                wake.notify_one();
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            result = attempt => {
                if let Err(error) = result {
                    tracing::debug!(%error, "notification listener disconnected");
                }
            }
        }
        // Wake once: notifications may have been missed while disconnected.
        wake.notify_one();
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff.next()) => {}
        }
    }
}

/// A lazily connected pool of at most `max` connections, opened with `pool`'s connect options
/// (server, credentials, TLS, and the relay's statement and lock timeouts when `pool` has them).
fn derived_pool(pool: &PgPool, max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(pool.options().get_acquire_timeout())
        .connect_lazy_with((*pool.connect_options()).clone())
}

/// How long the relay lets one of its statements run, and wait for a lock, on the server.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// `statement_timeout` on the relay's connections.
    pub statement: Duration,
    /// `lock_timeout` on the relay's connections.
    pub lock: Duration,
}

impl Timeouts {
    /// A pool like `pool` (same connect options and size, lazily connected) whose connections
    /// run with these timeouts: a statement blocked behind another session's lock, or running
    /// away, fails with an error the relay retries and reports, instead of hanging the loop.
    pub fn apply(&self, pool: &PgPool) -> PgPool {
        let ms = |d: Duration| format!("{}ms", d.as_millis().max(1));
        let options = (*pool.connect_options()).clone().options([
            ("statement_timeout", ms(self.statement)),
            ("lock_timeout", ms(self.lock)),
        ]);
        PgPoolOptions::new()
            .max_connections(pool.options().get_max_connections())
            .acquire_timeout(pool.options().get_acquire_timeout())
            .connect_lazy_with(options)
    }
}

fn split(fences: &[Fence]) -> (Vec<i32>, Vec<i64>) {
    fences.iter().copied().unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_statement_without_placeholders() {
        let sql = Sql::new(&Tables::new("s1", "ev").unwrap());
        for text in [
            &sql.claim,
            &sql.mark_published,
            &sql.mark_failed,
            &sql.acquire,
            &sql.renew,
            &sql.backlog,
            &sql.partitions,
            &sql.release_stale,
        ] {
            // No placeholder left (a `{` followed by a name); JSON literals such as '{}' stay.
            let placeholder = text
                .match_indices('{')
                .any(|(i, _)| text[i + 1..].starts_with(|c: char| c.is_ascii_lowercase()));
            assert!(!placeholder, "{text}");
            assert!(!text.trim().is_empty());
        }
        assert!(sql.mark_published.contains("FOR SHARE OF l"));
        assert!(sql.claim.contains("\"s1\".\"ev\""));
        assert!(sql.register.starts_with("INSERT INTO \"s1\".relays"));
    }
}
