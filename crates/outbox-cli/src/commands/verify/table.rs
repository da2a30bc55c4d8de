//! What the audit reads from the outbox, on PostgreSQL, MySQL and SQLite: the database's clock
//! when the audit begins, the rows a batch of broker messages carries (looked up by event id),
//! and every row of the window in id order, streamed.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use uuid::Uuid;

use super::audit::{aggregate_hash, Audit, Row};
use crate::commands::{Db, Outbox};

type Error = Box<dyn std::error::Error>;

/// The window of `occurred_at` the audit looks at.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// At or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Before this time.
    pub until: Option<DateTime<Utc>>,
}

/// SQLite's text form of a time, as the relay writes `published_at`.
fn sqlite_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// The database's clock now: rows marked published up to it have their message in the broker
/// before the audit reads the broker's end.
pub async fn now(outbox: &Outbox) -> Result<DateTime<Utc>, Error> {
    Ok(match &outbox.db {
        Db::Postgres(pool) => sqlx::query_scalar("SELECT now()").fetch_one(pool).await?,
        Db::MySql(pool) => {
            let t: chrono::NaiveDateTime = sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
                .fetch_one(pool)
                .await?;
            t.and_utc()
        }
        Db::Sqlite(pool) => {
            let t: String = sqlx::query_scalar("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')")
                .fetch_one(pool)
                .await?;
            DateTime::parse_from_rfc3339(&t)?.with_timezone(&Utc)
        }
    })
}

/// The rows whose event ids are among `ids`, each with whether it occurred in the window.
pub async fn lookup(
    outbox: &Outbox,
    ids: &[Uuid],
    window: Window,
) -> Result<HashMap<Uuid, Row>, Error> {
    let mut found = HashMap::with_capacity(ids.len());
    if ids.is_empty() {
        return Ok(found);
    }
    let tables = &outbox.tables;
    let texts: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    let rows: Vec<(String, i64, String, String, i64)> = match &outbox.db {
        Db::Postgres(pool) => {
            sqlx::query_as(&tables.render(
                "SELECT event_id::text, id, aggregate_type, aggregate_id,
                        (($2::timestamptz IS NULL OR occurred_at >= $2)
                         AND ($3::timestamptz IS NULL OR occurred_at < $3))::int::int8
                 FROM {schema}.{events}
                 WHERE event_id = ANY($1::text[]::uuid[])",
            ))
            .bind(&texts)
            .bind(window.since)
            .bind(window.until)
            .fetch_all(pool)
            .await?
        }
        Db::MySql(pool) => {
            let time = |t: Option<DateTime<Utc>>| t.map(|t| t.naive_utc());
            // CHAR(36) in a case-insensitive collation: either case of an id matches.
            let sql = tables.render_mysql(&format!(
                // The keys' binary collation reaches the client as bytes: converted to text.
                "SELECT event_id, id, CONVERT(aggregate_type USING utf8mb4),
                        CONVERT(aggregate_id USING utf8mb4),
                        CAST((? IS NULL OR occurred_at >= ?) AND (? IS NULL OR occurred_at < ?)
                             AS SIGNED)
                 FROM {{events}}
                 WHERE event_id IN ({})",
                vec!["?"; texts.len()].join(", ")
            ));
            let mut query = sqlx::query_as(&sql)
                .bind(time(window.since))
                .bind(time(window.since))
                .bind(time(window.until))
                .bind(time(window.until));
            for text in &texts {
                query = query.bind(text);
            }
            query.fetch_all(pool).await?
        }
        Db::Sqlite(pool) => {
            let time = |t: Option<DateTime<Utc>>| t.map(sqlite_time);
            // Text compared byte for byte: an id is looked up in lower and in upper case (the
            // forms writers use); one written in mixed case is not found.
            let forms: Vec<String> = texts
                .iter()
                .flat_map(|t| [t.clone(), t.to_uppercase()])
                .collect();
            let sql = tables.render_sqlite(&format!(
                "SELECT CAST(event_id AS TEXT), id, aggregate_type, aggregate_id,
                        (?1 IS NULL OR julianday(occurred_at) >= julianday(?1))
                        AND (?2 IS NULL OR julianday(occurred_at) < julianday(?2))
                 FROM {{events}}
                 WHERE event_id IN ({})",
                (3..forms.len() + 3)
                    .map(|i| format!("?{i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            let mut query = sqlx::query_as(&sql)
                .bind(time(window.since))
                .bind(time(window.until));
            for form in &forms {
                query = query.bind(form);
            }
            query.fetch_all(pool).await?
        }
    };
    for (event_id, id, aggregate_type, aggregate_id, in_window) in rows {
        if let Ok(event_id) = Uuid::parse_str(&event_id) {
            found.insert(
                event_id,
                Row {
                    id,
                    aggregate: aggregate_hash(&aggregate_type, &aggregate_id),
                    in_window: in_window == 1,
                },
            );
        }
    }
    Ok(found)
}

/// Feeds every row of the window to `audit`, in id order, streamed: whether each was
/// published, and whether after `began`. A SQLite row whose event id is not a UUID
/// (dead-lettered for it, never published) is left out.
pub async fn scan(
    outbox: &Outbox,
    window: Window,
    began: DateTime<Utc>,
    audit: &mut Audit,
) -> Result<(), Error> {
    let tables = &outbox.tables;
    let mut feed = |(id, event_id, published, later): (i64, String, i64, i64)| {
        if let Ok(event_id) = Uuid::parse_str(&event_id) {
            audit.row(id, event_id, published == 1, later == 1);
        }
    };
    match &outbox.db {
        Db::Postgres(pool) => {
            let sql = tables.render(
                "SELECT id, event_id::text,
                        (status = 'published')::int::int8,
                        COALESCE(status = 'published' AND published_at > $3, false)::int::int8
                 FROM {schema}.{events}
                 WHERE ($1::timestamptz IS NULL OR occurred_at >= $1)
                   AND ($2::timestamptz IS NULL OR occurred_at < $2)
                 ORDER BY id",
            );
            let mut rows = sqlx::query_as(&sql)
                .bind(window.since)
                .bind(window.until)
                .bind(began)
                .fetch(pool);
            while let Some(row) = rows.try_next().await? {
                feed(row);
            }
        }
        Db::MySql(pool) => {
            let time = |t: Option<DateTime<Utc>>| t.map(|t| t.naive_utc());
            let sql = tables.render_mysql(
                "SELECT id, event_id,
                        CAST(status = 'published' AS SIGNED),
                        CAST(IFNULL(status = 'published' AND published_at > ?, 0) AS SIGNED)
                 FROM {events}
                 WHERE (? IS NULL OR occurred_at >= ?) AND (? IS NULL OR occurred_at < ?)
                 ORDER BY id",
            );
            let mut rows = sqlx::query_as(&sql)
                .bind(began.naive_utc())
                .bind(time(window.since))
                .bind(time(window.since))
                .bind(time(window.until))
                .bind(time(window.until))
                .fetch(pool);
            while let Some(row) = rows.try_next().await? {
                feed(row);
            }
        }
        Db::Sqlite(pool) => {
            let time = |t: Option<DateTime<Utc>>| t.map(sqlite_time);
            let sql = tables.render_sqlite(
                "SELECT id, CAST(event_id AS TEXT),
                        status = 'published',
                        IFNULL(status = 'published' AND julianday(published_at) > julianday(?3), 0)
                 FROM {events}
                 WHERE (?1 IS NULL OR julianday(occurred_at) >= julianday(?1))
                   AND (?2 IS NULL OR julianday(occurred_at) < julianday(?2))
                 ORDER BY id",
            );
            let mut rows = sqlx::query_as(&sql)
                .bind(time(window.since))
                .bind(time(window.until))
                .bind(sqlite_time(began))
                .fetch(pool);
            while let Some(row) = rows.try_next().await? {
                feed(row);
            }
        }
    }
    Ok(())
}

/// Whether the outbox has a CDC slot set up (PostgreSQL): its writers may use the
/// zero-growth or table-less modes, whose events leave no row to compare with.
pub async fn has_cdc(outbox: &Outbox) -> Result<bool, Error> {
    let Db::Postgres(pool) = &outbox.db else {
        return Ok(false);
    };
    let tables = &outbox.tables;
    Ok(
        sqlx::query_scalar(&tables.render("SELECT EXISTS (SELECT 1 FROM {schema}.cdc_slots)"))
            .fetch_one(pool)
            .await?,
    )
}
