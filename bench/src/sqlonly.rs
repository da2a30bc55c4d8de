//! (j) `sqlonly`: the bare claim-and-mark limit. The same backlog, in an outbox of the same
//! shape (the relay's migrations, every index), drained by one client with the single
//! statement a relay without fencing, holds, ordering or a broker would need:
//! `UPDATE … SET status = 'published' WHERE id IN (SELECT id … WHERE status = 'pending' … LIMIT
//! n FOR UPDATE SKIP LOCKED) RETURNING …`, until it returns nothing. Every row is read and
//! marked in one statement; nothing is published. The relay's drain is measured against it.

use std::time::Instant;

use sqlx::{postgres::PgPoolOptions, Row};

use crate::{
    common::{interruptible, Result, Scope},
    context::Bench,
    cost::{Cpu, DbCounters, DbWork, Meter},
};

/// Figures of the SQL-only run.
#[derive(Clone, Debug)]
pub struct SqlOnlyResult {
    /// Statements run (the last returned nothing).
    pub statements: u64,
    /// CPU per process.
    pub cpu: Cpu,
    /// What the database did.
    pub db: DbWork,
}

impl SqlOnlyResult {
    /// Events claimed and marked per second.
    pub fn rate(&self) -> f64 {
        self.cpu.rate()
    }
}

/// Runs the scenario in its own schema, dropped afterwards.
pub async fn run(bench: &Bench) -> Result<SqlOnlyResult> {
    let scope = bench.scope("sqlonly")?;
    bench.create_outbox(&scope).await?;
    let result = interruptible(measure(bench, &scope)).await;
    bench.cleanup_schema(&scope).await;
    result
}

/// The statement: the pending rows the claimable index serves first (in the order it holds
/// them), locked, marked published and returned with the columns a relay publishes.
fn statement(scope: &Scope) -> String {
    scope.tables.render(
        "/* outbox-bench: sql-only */
         UPDATE {schema}.{events}
         SET status = 'published', published_at = now(), attempts = attempts + 1
         WHERE id IN (
             SELECT id FROM {schema}.{events}
             WHERE status = 'pending' AND next_attempt_at IS NULL
             ORDER BY partition, id
             LIMIT $1
             FOR UPDATE SKIP LOCKED)
         RETURNING id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
                   schema_version, destination, payload, content_type, headers::text,
                   occurred_at, partition, attempts",
    )
}

async fn measure(bench: &Bench, scope: &Scope) -> Result<SqlOnlyResult> {
    let events = bench.options.events;
    bench.log(scope.scenario, format!("inserting {events} events"));
    let insert_time = bench.insert_backlog(scope, events).await?;
    bench.log(
        scope.scenario,
        format!(
            "inserted in {:.1}s; claiming and marking with one client",
            insert_time.as_secs_f64()
        ),
    );
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&bench.options.database_url)
        .await?;
    let sql = statement(scope);
    let counters = DbCounters::take(&bench.pool, scope).await?;
    let meter = Meter::start(bench.processes(scope).await?);
    let started = Instant::now();
    let mut marked = 0u64;
    let mut statements = 0u64;
    let mut bytes = 0usize;
    loop {
        let rows = sqlx::query(&sql)
            .bind(bench.options.batch_size)
            .fetch_all(&pool)
            .await?;
        statements += 1;
        if rows.is_empty() {
            break;
        }
        // Read what a relay would publish, so that the client's share is counted too.
        for row in &rows {
            let payload: &[u8] = row.try_get("payload")?;
            let headers: &str = row.try_get("headers")?;
            bytes += payload.len() + headers.len();
        }
        marked += rows.len() as u64;
    }
    let cpu = meter.stop(marked);
    pool.close().await;
    let db = counters.since(&bench.pool, scope).await?;
    let pending = bench.pending(scope).await?;
    if pending != 0 || marked != events {
        return Err(format!("marked {marked} of {events}; {pending} still pending").into());
    }
    bench.log(
        scope.scenario,
        format!(
            "{marked} events in {:.1}s ({:.0} events/s, {statements} statements, {bytes} bytes \
             read)",
            started.elapsed().as_secs_f64(),
            cpu.rate()
        ),
    );
    Ok(SqlOnlyResult {
        statements,
        cpu,
        db,
    })
}
