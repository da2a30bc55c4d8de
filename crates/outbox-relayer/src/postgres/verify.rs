//! What `outbox verify` asks of PostgreSQL (see `verify.rs`).

use chrono::{DateTime, Utc};
use futures::{future::BoxFuture, TryStreamExt};
use outbox::{sql::named, Tables};
use sqlx::PgPool;
use uuid::Uuid;

use crate::verify::{Audited, Found, Scanned, Window};

fn sql(name: &str) -> &'static str {
    named(include_str!("sql/verify.sql"), name)
}

impl Audited for PgPool {
    fn now(&self) -> BoxFuture<'_, Result<DateTime<Utc>, sqlx::Error>> {
        Box::pin(sqlx::query_scalar(sql("now")).fetch_one(self))
    }

    fn lookup<'a>(
        &'a self,
        tables: &'a Tables,
        ids: &'a [Uuid],
        window: Window,
    ) -> BoxFuture<'a, Result<Vec<Found>, sqlx::Error>> {
        Box::pin(async move {
            let texts: Vec<String> = ids.iter().map(Uuid::to_string).collect();
            let rows: Vec<(String, i64, String, String, bool)> =
                sqlx::query_as(&tables.render(sql("lookup")))
                    .bind(&texts)
                    .bind(window.since)
                    .bind(window.until)
                    .fetch_all(self)
                    .await?;
            Ok(rows.into_iter().map(Found::of).collect())
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
            let statement = tables.render(sql("scan"));
            let mut rows = sqlx::query_as::<_, (i64, String, bool, bool)>(&statement)
                .bind(window.since)
                .bind(window.until)
                .bind(began)
                .fetch(self);
            while let Some((id, event_id, published, later)) = rows.try_next().await? {
                feed(Scanned {
                    id,
                    event_id,
                    published,
                    later,
                });
            }
            Ok(())
        })
    }

    fn has_cdc<'a>(&'a self, tables: &'a Tables) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar(&tables.render(sql("has_cdc")))
                .fetch_one(self)
                .await
        })
    }
}
