//! Operator actions on a PostgreSQL outbox (`sql/admin.sql`).

use std::{sync::Arc, time::Duration};

use outbox::{sql::named, Inbox, Tables};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::admin::{
    backend::{Action, AdminBackend},
    listing, Admin, AuditEntry, DeadLetter, DeadLetterFilter, Replayed,
};

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

impl Admin {
    /// Actions on the PostgreSQL outbox at `tables`.
    pub fn new(pool: sqlx::PgPool, tables: &Tables) -> Self {
        Self::from_backend(Arc::new(PgAdmin::new(pool, tables)))
    }
}

impl PgAdmin {
    /// Actions on the outbox at `tables`.
    pub(crate) fn new(pool: PgPool, tables: &Tables) -> Self {
        let file = include_str!("sql/admin.sql");
        let r = |name: &str| tables.render(named(file, name));
        Self {
            pool,
            tables: tables.clone(),
            purge: r("purge"),
            archive: r("archive"),
            purgeable: r("purgeable"),
            list_dead: listing::render_limits(&r("list_dead")),
            payload: r("payload"),
            replay: r("replay"),
            skip: r("skip"),
            audit: r("audit"),
        }
    }
}

impl AdminBackend for PgAdmin {
    /// Published rows older than `retention` (what a purge would delete now).
    fn purgeable(&self, retention: Duration) -> Action<'_, i64> {
        Box::pin(async move {
            sqlx::query_scalar(&self.purgeable)
                .bind(retention.as_secs_f64())
                .fetch_one(&self.pool)
                .await
        })
    }

    /// Deletes (or, with `archive`, moves to `{table}_archive`) one batch of published rows
    /// older than `retention`; returns how many.
    fn purge_batch(&self, retention: Duration, batch: i64, archive: bool) -> Action<'_, u64> {
        Box::pin(async move {
            let sql = if archive { &self.archive } else { &self.purge };
            sqlx::query(sql)
                .bind(retention.as_secs_f64())
                .bind(batch.max(1))
                .execute(&self.pool)
                .await
                .map(|done| done.rows_affected())
        })
    }

    /// Deletes inbox rows older than `retention` (see `outbox::postgres::PgInbox::purge` for
    /// the rule on choosing it); returns how many.
    fn purge_inbox(&self, retention: Duration, batch: i64) -> Action<'_, u64, outbox::Error> {
        Box::pin(async move {
            outbox::postgres::PgInbox::new(&self.tables)
                .purge(&self.pool, retention, batch)
                .await
        })
    }

    /// Dead letters matching `filter`, oldest first.
    fn dead_letters<'a>(&'a self, filter: &'a DeadLetterFilter) -> Action<'a, Vec<DeadLetter>> {
        Box::pin(async move {
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
                        listing::read_headers(r.try_get("headers")?, r.try_get("headers_size")?);
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
        })
    }

    /// The payload of row `id`, if it exists.
    fn payload(&self, id: i64) -> Action<'_, Option<Vec<u8>>> {
        Box::pin(async move {
            sqlx::query_scalar(&self.payload)
                .bind(id)
                .fetch_optional(&self.pool)
                .await
        })
    }

    /// Makes dead events pending again (attempts reset) and unparks their aggregates; returns
    /// how many were replayed. Recorded in the audit table.
    fn replay<'a>(
        &'a self,
        ids: &'a [i64],
        actor: &'a str,
        reason: &'a str,
    ) -> Action<'a, Replayed> {
        Box::pin(async move {
            let (replayed, not_replayed): (i64, Vec<i64>) = sqlx::query_as(&self.replay)
                .bind(ids)
                .bind(actor)
                .bind(reason)
                .fetch_one(&self.pool)
                .await?;
            Ok(Replayed {
                replayed,
                not_replayed,
            })
        })
    }

    /// Abandons dead events: they stay dead but stop parking their aggregates, whose later
    /// events then flow (the one exception to per-aggregate order, G4). Recorded in the audit
    /// table; returns how many aggregates were released.
    fn skip<'a>(&'a self, ids: &'a [i64], actor: &'a str, reason: &'a str) -> Action<'a, i64> {
        Box::pin(async move {
            sqlx::query_scalar(&self.skip)
                .bind(ids)
                .bind(actor)
                .bind(reason)
                .fetch_one(&self.pool)
                .await
        })
    }

    /// The latest `limit` audit records, newest first.
    fn audit(&self, limit: i64) -> Action<'_, Vec<AuditEntry>> {
        Box::pin(async move {
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
        })
    }

    /// On a time-partitioned outbox, creates the partitions from today to a week ahead that
    /// do not exist yet and returns their names (nothing on a plain table).
    fn create_partitions_ahead(&self) -> Action<'_, Vec<String>, outbox::Error> {
        Box::pin(async move {
            outbox::postgres::time_partitions::ensure_ahead(
                &self.pool,
                &self.tables,
                outbox::postgres::time_partitions::DEFAULT_PREMAKE_DAYS,
            )
            .await
        })
    }

    /// On a time-partitioned outbox, drops (or, with `archive`, archives then drops) the
    /// partitions that ended more than `retention` ago and hold only published events.
    fn drop_expired_partitions(
        &self,
        retention: Duration,
        archive: bool,
        dry_run: bool,
    ) -> Action<'_, outbox::postgres::time_partitions::DropReport, outbox::Error> {
        Box::pin(async move {
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
        })
    }
}
