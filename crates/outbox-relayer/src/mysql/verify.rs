//! What `outbox verify` asks of MySQL and MariaDB (see `verify.rs`).

use chrono::{DateTime, NaiveDateTime, Utc};
use futures::{future::BoxFuture, TryStreamExt};
use outbox::{sql::named, Tables};
use sqlx::MySqlPool;
use uuid::Uuid;

use crate::verify::{Audited, Found, Scanned, Window};

fn sql(name: &str) -> &'static str {
    named(include_str!("sql/verify.sql"), name)
}

/// `?`, `?`, … `n` times: the placeholders of a list of `n` values.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// A time as MySQL's `DATETIME(6)` columns hold it (UTC).
fn naive(t: Option<DateTime<Utc>>) -> Option<NaiveDateTime> {
    t.map(|t| t.naive_utc())
}

impl Audited for MySqlPool {
    fn now(&self) -> BoxFuture<'_, Result<DateTime<Utc>, sqlx::Error>> {
        Box::pin(async move {
            let now: NaiveDateTime = sqlx::query_scalar(sql("now")).fetch_one(self).await?;
            Ok(now.and_utc())
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
            let statement = tables
                .render_mysql(sql("lookup"))
                .replace("{ids}", &placeholders(ids.len()));
            let mut query = sqlx::query_as::<_, (String, i64, String, String, i64)>(&statement)
                .bind(naive(window.since))
                .bind(naive(window.since))
                .bind(naive(window.until))
                .bind(naive(window.until));
            for id in ids {
                query = query.bind(id.to_string());
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
            let statement = tables.render_mysql(sql("scan"));
            let mut rows = sqlx::query_as::<_, (i64, String, i64, i64)>(&statement)
                .bind(began.naive_utc())
                .bind(naive(window.since))
                .bind(naive(window.since))
                .bind(naive(window.until))
                .bind(naive(window.until))
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
