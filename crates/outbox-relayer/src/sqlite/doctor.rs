//! What `outbox doctor` asks of SQLite (see `doctor/database.rs`).

use std::sync::Arc;

use futures::future::BoxFuture;
use outbox::{sql::named, Tables};
use sqlx::SqlitePool;

use super::SqliteStore;
use crate::{
    doctor::database::{Examine, RecentEvent, Shipped},
    store::Store,
};

fn sql(name: &str) -> &'static str {
    named(include_str!("sql/doctor.sql"), name)
}

impl Examine for SqlitePool {
    fn product(&self) -> &'static str {
        "SQLite"
    }

    fn served(&self) -> bool {
        false
    }

    fn version(&self) -> BoxFuture<'_, Result<String, sqlx::Error>> {
        Box::pin(sqlx::query_scalar(sql("version")).fetch_one(self))
    }

    fn applied<'a>(&'a self, tables: &'a Tables) -> BoxFuture<'a, Result<Vec<i32>, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar(&tables.render_sqlite(sql("applied")))
                .fetch_all(self)
                .await
        })
    }

    fn shipped(&self) -> Shipped {
        outbox::sqlite::MIGRATIONS
    }

    fn store<'a>(
        &'a self,
        tables: &'a Tables,
    ) -> BoxFuture<'a, Result<Arc<dyn Store>, crate::Error>> {
        Box::pin(async move {
            let store = SqliteStore::open(self.clone(), tables).await?;
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
    }

    fn recent<'a>(
        &'a self,
        tables: &'a Tables,
    ) -> BoxFuture<'a, Result<Vec<RecentEvent>, sqlx::Error>> {
        Box::pin(async move {
            let rows: Vec<(String, String, i32, Option<String>)> =
                sqlx::query_as(&tables.render_sqlite(sql("recent")))
                    .fetch_all(self)
                    .await?;
            Ok(rows.into_iter().map(RecentEvent::from).collect())
        })
    }
}
