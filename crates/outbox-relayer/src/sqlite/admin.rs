//! Operator actions on a SQLite outbox (`sql/admin.sql`). SQLite runs one statement at a
//! time, so an action that PostgreSQL does in one statement is here a few in one write
//! transaction (`BEGIN IMMEDIATE`: no other writer between them).

use std::{sync::Arc, time::Duration};

use outbox::{sql::named, Inbox, Tables};
use sqlx::{sqlite::SqliteRow, Row, SqlitePool};

use super::store::parse_time;
use crate::admin::{
    backend::{Action, AdminBackend},
    listing, Admin, AuditEntry, DeadLetter, DeadLetterFilter, Replayed,
};

/// Operator actions on a SQLite outbox.
#[derive(Clone, Debug)]
pub(crate) struct SqliteAdmin {
    pool: SqlitePool,
    tables: Tables,
    sql: std::sync::Arc<Sql>,
}

#[derive(Debug)]
struct Sql {
    purgeable: String,
    purge: String,
    archive_batch: String,
    archive: String,
    delete_archived: String,
    list_dead: String,
    payload: String,
    replay: String,
    hold_heads: String,
    still_dead: String,
    skip_targets: String,
    move_hold: String,
    drop_hold: String,
    record: String,
    audit: String,
}

/// A retention as a SQLite date modifier: `-3600.000 seconds`.
fn age(retention: Duration) -> String {
    format!("-{:.3} seconds", retention.as_secs_f64())
}

/// Row ids as the JSON array the statements read with `json_each`.
fn json_ids(ids: &[i64]) -> String {
    serde_json::to_string(ids).expect("integers serialise")
}

/// A text column read as bytes (SQLite keeps any bytes a writer gives), invalid UTF-8
/// replaced.
fn text(row: &SqliteRow, name: &str) -> Result<Option<String>, sqlx::Error> {
    let bytes: Option<Vec<u8>> = row.try_get(name)?;
    Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

impl Admin {
    /// Actions on the SQLite outbox at `tables` (migrated with
    /// `outbox::sqlite::SqliteOutbox::migrate`).
    pub fn sqlite(pool: sqlx::SqlitePool, tables: &Tables) -> Self {
        Self::from_backend(Arc::new(SqliteAdmin::new(pool, tables)))
    }
}

impl SqliteAdmin {
    pub(crate) fn new(pool: SqlitePool, tables: &Tables) -> Self {
        let file = include_str!("sql/admin.sql");
        let r = |name: &str| tables.render_sqlite(named(file, name));
        let sql = Sql {
            purgeable: r("purgeable"),
            purge: r("purge"),
            archive_batch: r("archive_batch"),
            archive: r("archive"),
            delete_archived: r("delete_archived"),
            list_dead: listing::render_limits(&r("list_dead")),
            payload: r("payload"),
            replay: r("replay"),
            hold_heads: r("hold_heads"),
            still_dead: r("still_dead"),
            skip_targets: r("skip_targets"),
            move_hold: r("move_hold"),
            drop_hold: r("drop_hold"),
            record: r("record"),
            audit: r("audit"),
        };
        Self {
            pool,
            tables: tables.clone(),
            sql: std::sync::Arc::new(sql),
        }
    }

    /// A write transaction: the write lock is taken up front, so the statements of one
    /// action see no other writer's changes in between.
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }

    async fn record(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        actor: &str,
        action: &str,
        ids: &str,
        reason: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&self.sql.record)
            .bind(actor)
            .bind(action)
            .bind(ids)
            .bind(reason)
            .execute(&mut **tx)
            .await
            .map(drop)
    }
}

impl AdminBackend for SqliteAdmin {
    fn purgeable(&self, retention: Duration) -> Action<'_, i64> {
        Box::pin(async move {
            sqlx::query_scalar(&self.sql.purgeable)
                .bind(age(retention))
                .fetch_one(&self.pool)
                .await
        })
    }

    fn purge_batch(&self, retention: Duration, batch: i64, archive: bool) -> Action<'_, u64> {
        Box::pin(async move {
            if !archive {
                return sqlx::query(&self.sql.purge)
                    .bind(age(retention))
                    .bind(batch)
                    .execute(&self.pool)
                    .await
                    .map(|done| done.rows_affected());
            }
            let mut tx = self.begin_write().await?;
            let ids: Vec<i64> = sqlx::query_scalar(&self.sql.archive_batch)
                .bind(age(retention))
                .bind(batch)
                .fetch_all(&mut *tx)
                .await?;
            let ids = json_ids(&ids);
            sqlx::query(&self.sql.archive)
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
            let moved = sqlx::query(&self.sql.delete_archived)
                .bind(&ids)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            Ok(moved)
        })
    }

    fn purge_inbox(&self, retention: Duration, batch: i64) -> Action<'_, u64, outbox::Error> {
        Box::pin(async move {
            outbox::sqlite::SqliteInbox::new(&self.tables)
                .purge(&self.pool, retention, batch)
                .await
        })
    }

    fn dead_letters<'a>(&'a self, filter: &'a DeadLetterFilter) -> Action<'a, Vec<DeadLetter>> {
        Box::pin(async move {
            let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
                t.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
            };
            let rows = sqlx::query(&self.sql.list_dead)
                .bind(&filter.event_type)
                .bind(&filter.aggregate_type)
                .bind(&filter.aggregate_id)
                .bind(time(filter.since))
                .bind(time(filter.until))
                .bind(&filter.error_contains)
                .bind(filter.limit.unwrap_or(100))
                .bind(filter.ids.as_deref().map(json_ids))
                .fetch_all(&self.pool)
                .await?;
            rows.iter()
                .map(|r| {
                    let text_or_empty = |name: &str| text(r, name).map(Option::unwrap_or_default);
                    let (headers, truncated) =
                        listing::read_headers(text(r, "headers")?, r.try_get("headers_size")?);
                    Ok(DeadLetter {
                        id: r.try_get("id")?,
                        event_id: text_or_empty("event_id")?,
                        aggregate_type: text_or_empty("aggregate_type")?,
                        aggregate_id: text_or_empty("aggregate_id")?,
                        aggregate_version: r.try_get("aggregate_version")?,
                        event_type: text_or_empty("event_type")?,
                        schema_version: r.try_get("schema_version")?,
                        destination: text(r, "destination")?,
                        content_type: text_or_empty("content_type")?,
                        headers,
                        occurred_at: parse_time(&text_or_empty("occurred_at")?),
                        attempts: r.try_get("attempts")?,
                        last_error: text_or_empty("last_error")?,
                        payload_size: r.try_get("payload_size")?,
                        parked: r.try_get("parked")?,
                        truncated,
                    })
                })
                .collect()
        })
    }

    fn payload(&self, id: i64) -> Action<'_, Option<Vec<u8>>> {
        Box::pin(async move {
            sqlx::query_scalar(&self.sql.payload)
                .bind(id)
                .fetch_optional(&self.pool)
                .await
        })
    }

    fn replay<'a>(
        &'a self,
        ids: &'a [i64],
        actor: &'a str,
        reason: &'a str,
    ) -> Action<'a, Replayed> {
        Box::pin(async move {
            let mut tx = self.begin_write().await?;
            let mut replayed: Vec<i64> = sqlx::query_scalar(&self.sql.replay)
                .bind(json_ids(ids))
                .fetch_all(&mut *tx)
                .await?;
            replayed.sort_unstable();
            if !replayed.is_empty() {
                let replayed = json_ids(&replayed);
                sqlx::query(&self.sql.hold_heads)
                    .bind(&replayed)
                    .execute(&mut *tx)
                    .await?;
                self.record(&mut tx, actor, "replay", &replayed, reason)
                    .await?;
            }
            // What is still dead of what was asked: what the park rule left.
            let not_replayed: Vec<i64> = sqlx::query_scalar(&self.sql.still_dead)
                .bind(json_ids(ids))
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Replayed {
                replayed: replayed.len() as i64,
                not_replayed,
            })
        })
    }

    fn skip<'a>(&'a self, ids: &'a [i64], actor: &'a str, reason: &'a str) -> Action<'a, i64> {
        Box::pin(async move {
            let mut tx = self.begin_write().await?;
            let targets: Vec<(String, String, i64)> = sqlx::query_as(&self.sql.skip_targets)
                .bind(json_ids(ids))
                .fetch_all(&mut *tx)
                .await?;
            for (aggregate_type, aggregate_id, _) in &targets {
                let moved: Option<i64> = sqlx::query_scalar(&self.sql.move_hold)
                    .bind(aggregate_type)
                    .bind(aggregate_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                if moved.is_none() {
                    sqlx::query(&self.sql.drop_hold)
                        .bind(aggregate_type)
                        .bind(aggregate_id)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            if !targets.is_empty() {
                let released: Vec<i64> = targets.iter().map(|t| t.2).collect();
                self.record(&mut tx, actor, "skip", &json_ids(&released), reason)
                    .await?;
            }
            tx.commit().await?;
            Ok(targets.len() as i64)
        })
    }

    fn audit(&self, limit: i64) -> Action<'_, Vec<AuditEntry>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql.audit)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
            rows.iter()
                .map(|r| {
                    let at: String = r.try_get("at")?;
                    let ids: String = r.try_get("event_ids")?;
                    Ok(AuditEntry {
                        id: r.try_get("id")?,
                        at: parse_time(&at).ok_or_else(|| {
                            sqlx::Error::Decode(format!("audit time {at:?} is not a time").into())
                        })?,
                        actor: r.try_get("actor")?,
                        action: r.try_get("action")?,
                        event_ids: serde_json::from_str(&ids)
                            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                        reason: r.try_get("reason")?,
                    })
                })
                .collect()
        })
    }
}
