//! Operator actions on a PostgreSQL outbox (`sql/postgres.sql`).

use std::time::Duration;

use outbox::Tables;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::{AuditEntry, DeadLetter, DeadLetterFilter};
use crate::store::named;

/// Operator actions on a PostgreSQL outbox.
#[derive(Clone, Debug)]
pub(crate) struct PgAdmin {
    pool: PgPool,
    tables: Tables,
    purge: String,
    archive: String,
    purgeable: String,
    list_dead: String,
    payload: String,
    replay: String,
    skip: String,
    audit: String,
}

impl PgAdmin {
    /// Actions on the outbox at `tables`.
    pub(crate) fn new(pool: PgPool, tables: &Tables) -> Self {
        let file = include_str!("sql/postgres.sql");
        let r = |name: &str| tables.render(named(file, name));
        Self {
            pool,
            tables: tables.clone(),
            purge: r("purge"),
            archive: r("archive"),
            purgeable: r("purgeable"),
            list_dead: super::listing::render_limits(&r("list_dead")),
            payload: r("payload"),
            replay: r("replay"),
            skip: r("skip"),
            audit: r("audit"),
        }
    }

    /// On a time-partitioned outbox, creates the partitions from today to a week ahead that
    /// do not exist yet and returns their names (nothing on a plain table).
    pub(crate) async fn create_partitions_ahead(&self) -> Result<Vec<String>, outbox::Error> {
        outbox::postgres::time_partitions::ensure_ahead(
            &self.pool,
            &self.tables,
            outbox::postgres::time_partitions::DEFAULT_PREMAKE_DAYS,
        )
        .await
    }

    /// On a time-partitioned outbox, drops (or, with `archive`, archives then drops) the
    /// partitions that ended more than `retention` ago and hold only published events.
    pub(crate) async fn drop_expired_partitions(
        &self,
        retention: Duration,
        archive: bool,
        dry_run: bool,
    ) -> Result<outbox::postgres::time_partitions::DropReport, outbox::Error> {
        let retention = chrono::Duration::from_std(retention).map_err(|_| {
            outbox::Error::Schema(outbox::SchemaError::TimePartitioning(
                "retention too long".into(),
            ))
        })?;
        outbox::postgres::time_partitions::drop_expired(
            &self.pool,
            &self.tables,
            chrono::Utc::now() - retention,
            archive,
            dry_run,
        )
        .await
    }

    /// Published rows older than `retention` (what a purge would delete now).
    pub(crate) async fn purgeable(&self, retention: Duration) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(&self.purgeable)
            .bind(retention.as_secs_f64())
            .fetch_one(&self.pool)
            .await
    }

    /// Deletes (or, with `archive`, moves to `{table}_archive`) one batch of published rows
    /// older than `retention`; returns how many.
    pub(crate) async fn purge_batch(
        &self,
        retention: Duration,
        batch: i64,
        archive: bool,
    ) -> Result<u64, sqlx::Error> {
        let sql = if archive { &self.archive } else { &self.purge };
        sqlx::query(sql)
            .bind(retention.as_secs_f64())
            .bind(batch.max(1))
            .execute(&self.pool)
            .await
            .map(|done| done.rows_affected())
    }

    /// Deletes inbox rows older than `retention` (see `outbox::postgres::PgInbox::purge` for
    /// the rule on choosing it); returns how many.
    pub(crate) async fn purge_inbox(
        &self,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, outbox::Error> {
        outbox::postgres::PgInbox::new(&self.tables)
            .purge(&self.pool, retention, batch)
            .await
    }

    /// Dead letters matching `filter`, oldest first.
    pub(crate) async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetter>, sqlx::Error> {
        let rows = sqlx::query(&self.list_dead)
            .bind(&filter.event_type)
            .bind(&filter.aggregate_type)
            .bind(&filter.aggregate_id)
            .bind(filter.since)
            .bind(filter.until)
            .bind(&filter.error_contains)
            .bind(filter.limit.unwrap_or(100))
            .bind(&filter.ids)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let (headers, truncated) =
                    super::listing::read_headers(r.try_get("headers")?, r.try_get("headers_size")?);
                Ok(DeadLetter {
                    id: r.try_get("id")?,
                    event_id: r.try_get::<Uuid, _>("event_id")?.to_string(),
                    aggregate_type: r.try_get("aggregate_type")?,
                    aggregate_id: r.try_get("aggregate_id")?,
                    aggregate_version: r.try_get("aggregate_version")?,
                    event_type: r.try_get("event_type")?,
                    schema_version: r.try_get("schema_version")?,
                    destination: r.try_get("destination")?,
                    content_type: r.try_get("content_type")?,
                    headers,
                    occurred_at: Some(r.try_get("occurred_at")?),
                    attempts: r.try_get("attempts")?,
                    last_error: r.try_get("last_error")?,
                    payload_size: r.try_get("payload_size")?,
                    parked: r.try_get("parked")?,
                    truncated,
                })
            })
            .collect()
    }

    /// The payload of row `id`, if it exists.
    pub(crate) async fn payload(&self, id: i64) -> Result<Option<Vec<u8>>, sqlx::Error> {
        sqlx::query_scalar(&self.payload)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
    }

    /// Makes dead events pending again (attempts reset) and unparks their aggregates; returns
    /// how many were replayed. Recorded in the audit table.
    pub(crate) async fn replay(
        &self,
        ids: &[i64],
        actor: &str,
        reason: &str,
    ) -> Result<super::Replayed, sqlx::Error> {
        let (replayed, not_replayed): (i64, Vec<i64>) = sqlx::query_as(&self.replay)
            .bind(ids)
            .bind(actor)
            .bind(reason)
            .fetch_one(&self.pool)
            .await?;
        Ok(super::Replayed {
            replayed,
            not_replayed,
        })
    }

    /// Abandons dead events: they stay dead but stop parking their aggregates, whose later
    /// events then flow (the one exception to per-aggregate order, G4). Recorded in the audit
    /// table; returns how many aggregates were released.
    pub(crate) async fn skip(
        &self,
        ids: &[i64],
        actor: &str,
        reason: &str,
    ) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(&self.skip)
            .bind(ids)
            .bind(actor)
            .bind(reason)
            .fetch_one(&self.pool)
            .await
    }

    /// The latest `limit` audit records, newest first.
    pub(crate) async fn audit(&self, limit: i64) -> Result<Vec<AuditEntry>, sqlx::Error> {
        let rows = sqlx::query(&self.audit)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(AuditEntry {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    event_ids: r.try_get("event_ids")?,
                    reason: r.try_get("reason")?,
                })
            })
            .collect()
    }
}
