//! What `outbox verify` asks of SQLite (see `verify.rs`).

use chrono::{DateTime, Utc};
use futures::{future::BoxFuture, TryStreamExt};
use outbox::{sql::named, Tables};
use sqlx::SqlitePool;
use uuid::Uuid;

use crate::verify::{Audited, Found, Scanned, Window};

fn sql(name: &str) -> &'static str {
    named(include_str!("sql/verify.sql"), name)
}

/// SQLite's text form of a time, as the relay writes `published_at`.
fn text(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

impl Audited for SqlitePool {
    fn now(&self) -> BoxFuture<'_, Result<DateTime<Utc>, sqlx::Error>> {
        Box::pin(async move {
            let now: String = sqlx::query_scalar(sql("now")).fetch_one(self).await?;
            DateTime::parse_from_rfc3339(&now)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| sqlx::Error::Decode(Box::new(e)))
        })
    }

    fn lookup<'a>(
        &'a self,
        tables: &'a Tables,
        ids: &'a [Uuid],
        window: Window,
    ) -> BoxFuture<'a, Result<Vec<Found>, sqlx::Error>> {
        Box::pin(async move {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            // Text compared byte for byte: an id is looked up in lower and in upper case (the
            // forms writers use); one written in mixed case is not found.
            let forms: Vec<String> = ids
                .iter()
                .map(Uuid::to_string)
                .flat_map(|t| [t.to_uppercase(), t])
                .collect();
            let list = (3..forms.len() + 3)
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let statement = tables.render_sqlite(sql("lookup")).replace("{ids}", &list);
            let mut query = sqlx::query_as::<_, (String, i64, String, String, i64)>(&statement)
                .bind(window.since.map(text))
                .bind(window.until.map(text));
            for form in &forms {
                query = query.bind(form);
            }
            let rows = query.fetch_all(self).await?;
            Ok(rows
                .into_iter()
                .map(|(event_id, id, kind, aggregate, in_window)| {
                    Found::of((event_id, id, kind, aggregate, in_window == 1))
                })
                .collect())
        })
    }

    fn scan<'a>(
        &'a self,
        tables: &'a Tables,
        window: Window,
        began: DateTime<Utc>,
        feed: &'a mut (dyn FnMut(Scanned) + Send),
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let statement = tables.render_sqlite(sql("scan"));
            let mut rows = sqlx::query_as::<_, (i64, String, i64, i64)>(&statement)
                .bind(window.since.map(text))
                .bind(window.until.map(text))
                .bind(text(began))
                .fetch(self);
            while let Some((id, event_id, published, later)) = rows.try_next().await? {
                feed(Scanned {
                    id,
                    event_id,
                    published: published == 1,
                    later: later == 1,
                });
            }
            Ok(())
        })
    }
}
