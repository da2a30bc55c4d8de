//! What `outbox doctor` asks of PostgreSQL (see `doctor/database.rs`), with its own checks:
//! privileges on the outbox's schema, autovacuum and planner statistics of the events table.

use std::sync::Arc;

use futures::future::BoxFuture;
use outbox::{sql::named, Tables};
use sqlx::PgPool;

use super::PgStore;
use crate::{
    doctor::{
        database::{Examine, RecentEvent, Shipped},
        Check,
    },
    store::Store,
};

const AREA: &str = "database";

fn sql(name: &str) -> &'static str {
    named(include_str!("sql/doctor.sql"), name)
}

/// The server's `autovacuum`, the table's own switch, live and dead tuples, and whether it was
/// ever analyzed.
type VacuumRow = (String, bool, Option<i64>, Option<i64>, bool);

impl Examine for PgPool {
    fn product(&self) -> &'static str {
        "PostgreSQL"
    }

    fn version(&self) -> BoxFuture<'_, Result<String, sqlx::Error>> {
        Box::pin(sqlx::query_scalar(sql("version")).fetch_one(self))
    }

    fn applied<'a>(&'a self, tables: &'a Tables) -> BoxFuture<'a, Result<Vec<i32>, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar(&tables.render(sql("applied")))
                .fetch_all(self)
                .await
        })
    }

    fn shipped(&self) -> Shipped {
        outbox::postgres::MIGRATIONS
    }

    fn store<'a>(
        &'a self,
        tables: &'a Tables,
    ) -> BoxFuture<'a, Result<Arc<dyn Store>, crate::Error>> {
        Box::pin(async move {
            let store = PgStore::open(self.clone(), tables).await?;
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
    }

    fn settings<'a>(&'a self, tables: &'a Tables) -> BoxFuture<'a, Vec<Check>> {
        Box::pin(async move {
            let mut checks = vec![privileges(self, tables).await];
            checks.extend(vacuum(self, tables).await);
            checks
        })
    }

    fn recent<'a>(
        &'a self,
        tables: &'a Tables,
    ) -> BoxFuture<'a, Result<Vec<RecentEvent>, sqlx::Error>> {
        Box::pin(async move {
            let rows: Vec<(String, String, i32, Option<String>)> =
                sqlx::query_as(&tables.render(sql("recent")))
                    .fetch_all(self)
                    .await?;
            Ok(rows.into_iter().map(RecentEvent::from).collect())
        })
    }
}

/// Whether this user may read and change every table of the outbox's schema.
async fn privileges(pool: &PgPool, tables: &Tables) -> Check {
    let schema = tables.schema().as_str();
    let lacking: Result<Vec<String>, sqlx::Error> = sqlx::query_scalar(sql("lacking"))
        .bind(schema)
        .fetch_all(pool)
        .await;
    match lacking {
        Ok(lacking) if lacking.is_empty() => Check::ok(
            AREA,
            "privileges",
            format!("SELECT, INSERT, UPDATE, DELETE on every table of schema {schema}"),
        ),
        Ok(lacking) => Check::fail(
            AREA,
            "privileges",
            format!(
                "this user lacks SELECT, INSERT, UPDATE or DELETE on {}",
                lacking.join(", ")
            ),
            format!(
                "GRANT USAGE ON SCHEMA {schema} TO <relay user>; GRANT SELECT, INSERT, UPDATE, \
                 DELETE ON ALL TABLES IN SCHEMA {schema} TO <relay user>; GRANT USAGE ON ALL \
                 SEQUENCES IN SCHEMA {schema} TO <relay user>"
            ),
        ),
        Err(error) => Check::warn(
            AREA,
            "privileges",
            format!("could not be read: {error}"),
            "run doctor as the relay's user",
        ),
    }
}

/// Autovacuum on the events table (off, or lagging far behind) and its planner statistics.
async fn vacuum(pool: &PgPool, tables: &Tables) -> Vec<Check> {
    let events = tables.render("{schema}.{events}");
    let vacuum: Result<VacuumRow, sqlx::Error> = sqlx::query_as(sql("vacuum"))
        .bind(&events)
        .fetch_one(pool)
        .await;
    let (setting, table_enabled, live, dead, analyzed) = match vacuum {
        Ok(row) => row,
        Err(error) => {
            return vec![Check::warn(
                AREA,
                "autovacuum",
                format!("could not be read: {error}"),
                "run doctor as the relay's user",
            )]
        }
    };
    let (live, dead) = (live.unwrap_or(0), dead.unwrap_or(0));
    let autovacuum = if setting != "on" || !table_enabled {
        Check::warn(
            AREA,
            "autovacuum",
            format!(
                "off for {events} ({}): published rows leave dead tuples and index entries \
                 that claims read past until something vacuums ({dead} dead, {live} live now)",
                if setting != "on" {
                    "autovacuum = off on the server"
                } else {
                    "autovacuum_enabled = false on the table"
                }
            ),
            format!(
                "turn autovacuum on, or schedule `VACUUM (ANALYZE) {events}` every few \
                 minutes; `outbox purge` removes published rows"
            ),
        )
    } else if dead > 100_000 && dead > 4 * live.max(1) {
        Check::warn(
            AREA,
            "autovacuum",
            format!("{dead} dead tuples against {live} live in {events}: vacuum lags"),
            format!(
                "ALTER TABLE {events} SET (autovacuum_vacuum_scale_factor = 0.01, \
                 autovacuum_vacuum_cost_delay = 0)"
            ),
        )
    } else {
        Check::ok(
            AREA,
            "autovacuum",
            format!("on ({dead} dead, {live} live tuples)"),
        )
    };
    let statistics = if analyzed || live + dead == 0 {
        Check::ok(
            AREA,
            "statistics",
            format!("{events} has planner statistics"),
        )
    } else {
        Check::warn(
            AREA,
            "statistics",
            format!("{events} was never analyzed: the planner guesses its size"),
            format!("ANALYZE {events} (the relay also refreshes them while it runs)"),
        )
    };
    vec![autovacuum, statistics]
}
