//! (c) `naive`: the seed's design as a baseline. A loop selects 50 pending rows by
//! `occurred_at`, publishes each to JetStream and waits for its ack, marks each row with its own
//! `UPDATE`, then sleeps 2 s.

use std::time::{Duration, Instant};

use sqlx::Row;

use crate::{
    common::{interruptible, Result, Scope},
    context::Bench,
};

/// Rows per poll of the naive loop.
const BATCH: i64 = 50;
/// Sleep between polls of the naive loop.
const SLEEP: Duration = Duration::from_secs(2);
/// Backlog the projection refers to.
const PROJECTED_EVENTS: f64 = 1_000_000.0;

/// Figures of the naive loop.
#[derive(Clone, Debug)]
pub struct NaiveResult {
    /// Events published and marked.
    pub published: u64,
    /// How long the loop ran.
    pub elapsed: Duration,
}

impl NaiveResult {
    /// Events published per second.
    pub fn rate(&self) -> f64 {
        self.published as f64 / self.elapsed.as_secs_f64()
    }

    /// Time this loop would take to drain 1,000,000 events.
    pub fn projected_1m(&self) -> Duration {
        Duration::from_secs_f64(PROJECTED_EVENTS / self.rate().max(f64::MIN_POSITIVE))
    }
}

/// Runs the scenario in its own schema and stream, removed afterwards.
pub async fn run(bench: &Bench) -> Result<NaiveResult> {
    let scope = bench.scope("naive")?;
    bench.create_outbox(&scope).await?;
    let result = interruptible(async {
        bench.create_stream(&scope).await?;
        measure(bench, &scope).await
    })
    .await;
    bench.cleanup(&scope).await;
    result
}

async fn measure(bench: &Bench, scope: &Scope) -> Result<NaiveResult> {
    let backlog = bench.options.naive_backlog;
    bench.insert_backlog(scope, backlog).await?;
    let duration = Duration::from_secs(bench.options.naive_seconds);
    bench.log(
        scope.scenario,
        format!("{backlog} events pending; running the naive loop for {duration:?}"),
    );
    let select = format!(
        "SELECT id, aggregate_type, event_type, payload FROM {} \
         WHERE status = 'pending' ORDER BY occurred_at LIMIT $1",
        scope.events_table()
    );
    let update = format!(
        "UPDATE {} SET status = 'published', published_at = now() WHERE id = $1",
        scope.events_table()
    );
    let started = Instant::now();
    let deadline = started + duration;
    let mut published = 0u64;
    while Instant::now() < deadline {
        let rows = sqlx::query(&select)
            .bind(BATCH)
            .fetch_all(&bench.pool)
            .await?;
        for row in rows {
            let subject = format!(
                "{}.{}.{}",
                scope.subjects,
                row.get::<String, _>("aggregate_type"),
                row.get::<String, _>("event_type")
            );
            let payload: Vec<u8> = row.get("payload");
            bench.js()?.publish(subject, payload.into()).await?.await?;
            sqlx::query(&update)
                .bind(row.get::<i64, _>("id"))
                .execute(&bench.pool)
                .await?;
            published += 1;
        }
        tokio::time::sleep(SLEEP.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
    let result = NaiveResult {
        published,
        elapsed: started.elapsed(),
    };
    bench.log(
        scope.scenario,
        format!(
            "{published} events in {:.1}s ({:.1} events/s)",
            result.elapsed.as_secs_f64(),
            result.rate()
        ),
    );
    Ok(result)
}
