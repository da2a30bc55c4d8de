//! Operator actions on a MySQL or MariaDB outbox (`sql/admin.sql`). What PostgreSQL does in
//! one statement is here a few in one transaction, each row it changes read first with a
//! locking read (MySQL has no `RETURNING`).

use std::{sync::Arc, time::Duration};

use chrono::NaiveDateTime;
use outbox::{sql::named, Inbox, Tables};
use sqlx::{MySqlConnection, MySqlPool, Row};

use super::store::{bind_list, key_text, listed};
use crate::admin::{
    backend::{Action, AdminBackend},
    listing, Admin, AuditEntry, DeadLetter, DeadLetterFilter, Replayed,
};

/// Operator actions on a MySQL outbox.
#[derive(Clone, Debug)]
pub(crate) struct MySqlAdmin {
    pool: MySqlPool,
    tables: Tables,
    file: std::sync::Arc<String>,
}

/// A retention in microseconds, as the statements subtract it.
fn micros(retention: Duration) -> i64 {
    i64::try_from(retention.as_micros()).unwrap_or(i64::MAX)
}

/// Row ids as a JSON array (the audit's `event_ids`, the list's id filter).
fn json_ids(ids: &[i64]) -> String {
    serde_json::to_string(ids).expect("integers serialise")
}

impl Admin {
    /// Actions on the MySQL or MariaDB outbox at `tables` (migrated with
    /// `outbox::mysql::MySqlOutbox::migrate`), on connections of their own set to the default
    /// [`outbox::mysql::Session`].
    pub fn mysql(pool: sqlx::MySqlPool, tables: &Tables) -> Self {
        Self::mysql_with(pool, tables, outbox::mysql::Session::default())
    }

    /// [`Admin::mysql`] on connections set to `session`: opened with `pool`'s connect options
    /// and size, READ COMMITTED whatever the server's default, so that a purge never locks
    /// the gaps the application's inserts go into.
    pub fn mysql_with(
        pool: sqlx::MySqlPool,
        tables: &Tables,
        session: outbox::mysql::Session,
    ) -> Self {
        Self::from_backend(Arc::new(MySqlAdmin::new(session.pool(&pool), tables)))
    }
}

impl MySqlAdmin {
    pub(crate) fn new(pool: MySqlPool, tables: &Tables) -> Self {
        Self {
            pool,
            tables: tables.clone(),
            file: std::sync::Arc::new(listing::render_limits(
                &tables
                    .render_mysql(include_str!("sql/admin.sql"))
                    .replace("{now_ms}", super::store::NOW_MS),
            )),
        }
    }

    fn sql(&self, name: &str) -> &str {
        named(&self.file, name)
    }

    fn listed(&self, name: &str, n: usize) -> String {
        listed(self.sql(name), &[("ids", n)])
    }

    async fn record(
        &self,
        conn: &mut MySqlConnection,
        actor: &str,
        action: &str,
        ids: &[i64],
        reason: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(self.sql("record"))
            .bind(actor)
            .bind(action)
            .bind(json_ids(ids))
            .bind(reason)
            .execute(conn)
            .await
            .map(drop)
    }
}

impl AdminBackend for MySqlAdmin {
    fn purgeable(&self, retention: Duration) -> Action<'_, i64> {
        Box::pin(async move {
            sqlx::query_scalar(self.sql("purgeable"))
                .bind(micros(retention))
                .fetch_one(&self.pool)
                .await
        })
    }

    fn purge_batch(&self, retention: Duration, batch: i64, archive: bool) -> Action<'_, u64> {
        Box::pin(async move {
            let found: Vec<i64> = sqlx::query_scalar(self.sql("purge_batch"))
                .bind(micros(retention))
                .bind(batch)
                .fetch_all(&self.pool)
                .await?;
            if found.is_empty() {
                return Ok(0);
            }
            let mut tx = self.pool.begin().await?;
            let result = async {
                let ids: Vec<i64> = bind_list(
                    sqlx::query_scalar(&self.listed("lock_batch", found.len())),
                    &found,
                )
                .fetch_all(&mut *tx)
                .await?;
                if ids.is_empty() {
                    // Another purge took them first.
                    return Ok(0);
                }
                if archive {
                    bind_list(sqlx::query(&self.listed("archive", ids.len())), &ids)
                        .execute(&mut *tx)
                        .await?;
                }
                bind_list(sqlx::query(&self.listed("delete_batch", ids.len())), &ids)
                    .execute(&mut *tx)
                    .await
                    .map(|done| done.rows_affected())
            }
            .await;
            crate::db::finish(tx, result).await
        })
    }

    fn purge_inbox(&self, retention: Duration, batch: i64) -> Action<'_, u64, outbox::Error> {
        Box::pin(async move {
            outbox::mysql::MySqlInbox::new(&self.tables)
                .purge(&self.pool, retention, batch)
                .await
        })
    }

    fn dead_letters<'a>(&'a self, filter: &'a DeadLetterFilter) -> Action<'a, Vec<DeadLetter>> {
        Box::pin(async move {
            let time = |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| t.naive_utc());
            let ids = filter.ids.as_deref().map(json_ids);
            let rows = sqlx::query(self.sql("list_dead"))
                .bind(&filter.event_type)
                .bind(&filter.event_type)
                .bind(&filter.aggregate_type)
                .bind(&filter.aggregate_type)
                .bind(&filter.aggregate_id)
                .bind(&filter.aggregate_id)
                .bind(time(filter.since))
                .bind(time(filter.since))
                .bind(time(filter.until))
                .bind(time(filter.until))
                .bind(&filter.error_contains)
                .bind(&filter.error_contains)
                .bind(&ids)
                .bind(&ids)
                .bind(filter.limit.unwrap_or(100))
                .fetch_all(&self.pool)
                .await?;
            rows.iter()
                .map(|r| {
                    let (headers, truncated) =
                        listing::read_headers(r.try_get("headers")?, r.try_get("headers_size")?);
                    let occurred_at: NaiveDateTime = r.try_get("occurred_at")?;
                    Ok(DeadLetter {
                        id: r.try_get("id")?,
                        event_id: r.try_get("event_id")?,
                        aggregate_type: key_text(r, "aggregate_type")?,
                        aggregate_id: key_text(r, "aggregate_id")?,
                        aggregate_version: r.try_get("aggregate_version")?,
                        event_type: r.try_get("event_type")?,
                        schema_version: r.try_get("schema_version")?,
                        destination: r.try_get("destination")?,
                        content_type: r.try_get("content_type")?,
                        headers,
                        occurred_at: Some(occurred_at.and_utc()),
                        attempts: r.try_get("attempts")?,
                        last_error: r.try_get("last_error")?,
                        payload_size: r.try_get("payload_size")?,
                        parked: r.try_get::<i64, _>("parked")? != 0,
                        truncated,
                    })
                })
                .collect()
        })
    }

    fn payload(&self, id: i64) -> Action<'_, Option<Vec<u8>>> {
        Box::pin(async move {
            sqlx::query_scalar(self.sql("payload"))
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
            if ids.is_empty() {
                return Ok(Replayed::default());
            }
            let mut tx = self.pool.begin().await?;
            let result = async {
                // `{ids}` twice: the rows asked for, and the parks the replay leaves in place.
                let dead_of = self.listed("dead_of", ids.len());
                let replayed: Vec<i64> =
                    bind_list(bind_list(sqlx::query_scalar(&dead_of), ids), ids)
                        .fetch_all(&mut *tx)
                        .await?;
                let n = replayed.len();
                if n > 0 {
                    bind_list(sqlx::query(&self.listed("replay", n)), &replayed)
                        .execute(&mut *tx)
                        .await?;
                    bind_list(sqlx::query(&self.listed("hold_heads", n)), &replayed)
                        .execute(&mut *tx)
                        .await?;
                    self.record(&mut tx, actor, "replay", &replayed, reason)
                        .await?;
                }
                // What is still dead of what was asked: what the park rule left.
                let not_replayed: Vec<i64> = bind_list(
                    sqlx::query_scalar(&self.listed("still_dead", ids.len())),
                    ids,
                )
                .fetch_all(&mut *tx)
                .await?;
                Ok(Replayed {
                    replayed: n as i64,
                    not_replayed,
                })
            }
            .await;
            crate::db::finish(tx, result).await
        })
    }

    fn skip<'a>(&'a self, ids: &'a [i64], actor: &'a str, reason: &'a str) -> Action<'a, i64> {
        Box::pin(async move {
            if ids.is_empty() {
                return Ok(0);
            }
            let mut tx = self.pool.begin().await?;
            let result = async {
                let targets: Vec<(String, String, i64)> =
                    bind_list(sqlx::query(&self.listed("skip_targets", ids.len())), ids)
                        .fetch_all(&mut *tx)
                        .await?
                        .iter()
                        .map(|r| Ok((key_text(r, 0)?, key_text(r, 1)?, r.try_get(2)?)))
                        .collect::<Result<_, sqlx::Error>>()?;
                for (aggregate_type, aggregate_id, _) in &targets {
                    let first: Option<(i64, i32)> = sqlx::query_as(self.sql("first_pending"))
                        .bind(aggregate_type)
                        .bind(aggregate_id)
                        .fetch_optional(&mut *tx)
                        .await?;
                    match first {
                        Some((id, partition)) => {
                            sqlx::query(self.sql("move_hold"))
                                .bind(id)
                                .bind(partition)
                                .bind(aggregate_type)
                                .bind(aggregate_id)
                                .execute(&mut *tx)
                                .await?
                        }
                        None => {
                            sqlx::query(self.sql("drop_hold"))
                                .bind(aggregate_type)
                                .bind(aggregate_id)
                                .execute(&mut *tx)
                                .await?
                        }
                    };
                }
                if !targets.is_empty() {
                    let released: Vec<i64> = targets.iter().map(|t| t.2).collect();
                    self.record(&mut tx, actor, "skip", &released, reason)
                        .await?;
                }
                Ok(targets.len() as i64)
            }
            .await;
            crate::db::finish(tx, result).await
        })
    }

    fn audit(&self, limit: i64) -> Action<'_, Vec<AuditEntry>> {
        Box::pin(async move {
            let rows = sqlx::query(self.sql("audit"))
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
            rows.iter()
                .map(|r| {
                    let at: NaiveDateTime = r.try_get("at")?;
                    let ids: String = r.try_get("event_ids")?;
                    Ok(AuditEntry {
                        id: r.try_get("id")?,
                        at: at.and_utc(),
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
