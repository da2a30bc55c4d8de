//! What `outbox doctor` asks of MySQL and MariaDB (see `doctor/database.rs`).

use std::sync::Arc;

use futures::future::BoxFuture;
use outbox::{sql::named, Tables};
use sqlx::{MySqlPool, Row};

use super::{store::key_text, MySqlStore};
use crate::{
    doctor::database::{Examine, RecentEvent, Shipped},
    store::Store,
};

fn sql(name: &str) -> &'static str {
    named(include_str!("sql/doctor.sql"), name)
}

impl Examine for MySqlPool {
    fn product(&self) -> &'static str {
        "MySQL/MariaDB"
    }

    fn version(&self) -> BoxFuture<'_, Result<String, sqlx::Error>> {
        Box::pin(sqlx::query_scalar(sql("version")).fetch_one(self))
    }

    fn applied<'a>(&'a self, tables: &'a Tables) -> BoxFuture<'a, Result<Vec<i32>, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar(&tables.render_mysql(sql("applied")))
                .fetch_all(self)
                .await
        })
    }

    fn shipped(&self) -> Shipped {
        outbox::mysql::MIGRATIONS
    }

    fn store<'a>(
        &'a self,
        tables: &'a Tables,
    ) -> BoxFuture<'a, Result<Arc<dyn Store>, crate::Error>> {
        Box::pin(async move {
            let store = MySqlStore::open(self.clone(), tables).await?;
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
    }

    fn recent<'a>(
        &'a self,
        tables: &'a Tables,
    ) -> BoxFuture<'a, Result<Vec<RecentEvent>, sqlx::Error>> {
        Box::pin(async move {
            let rows = sqlx::query(&tables.render_mysql(sql("recent")))
                .fetch_all(self)
                .await?;
            rows.iter()
                .map(|row| {
                    let destination: Option<Vec<u8>> = row.try_get(3)?;
                    Ok(RecentEvent {
                        aggregate_type: key_text(row, 0)?,
                        event_type: key_text(row, 1)?,
                        schema_version: row.try_get(2)?,
                        destination: match destination {
                            Some(_) => Some(key_text(row, 3)?),
                            None => None,
                        },
                    })
                })
                .collect()
        })
    }
}
