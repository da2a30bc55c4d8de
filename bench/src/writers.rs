//! Writers for (d) `steady`: tasks that each own a connection and commit one event per
//! transaction through `PgOutbox::enqueue`, as fast as they can or at a fixed rate.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use outbox::{postgres::PgOutbox, Event, Outbox};
use sqlx::{Connection, PgConnection};

use crate::common::{payload, Result};

/// How the writers are run.
#[derive(Clone, Debug)]
pub struct WriterSettings {
    /// PostgreSQL URL; each writer opens its own connection.
    pub database_url: String,
    /// Number of concurrent writers.
    pub writers: usize,
    /// Distinct aggregates the events are spread over.
    pub aggregates: u64,
    /// How long to write.
    pub duration: Duration,
    /// Total events per second over all writers; `None`: as fast as possible.
    pub rate: Option<f64>,
}

/// Commits made by a writer run.
#[derive(Clone, Debug, Default)]
pub struct WriteRate {
    /// Transactions committed (one event each).
    pub commits: u64,
    /// From the start of the writers to the last commit.
    pub elapsed: Duration,
    /// Each transaction's time, from creating its event to the commit's answer, ms, sorted.
    pub transaction_ms: Vec<f64>,
    /// Each event's id and when its commit was answered (wall clock).
    pub committed: Vec<(uuid::Uuid, chrono::DateTime<chrono::Utc>)>,
}

impl WriteRate {
    /// Commits per second.
    pub fn per_second(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// Connects the writers, then runs them for `settings.duration`.
pub async fn run(settings: &WriterSettings, outbox: &PgOutbox) -> Result<WriteRate> {
    let writers = settings.writers.max(1);
    let mut connections = Vec::with_capacity(writers);
    for _ in 0..writers {
        connections.push(PgConnection::connect(&settings.database_url).await?);
    }
    let sequence = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + settings.duration;
    // Paced writers tick every `period`, offset from each other so the load is even.
    let period = settings
        .rate
        .map(|rate| Duration::from_secs_f64(writers as f64 / rate.max(0.001)));
    let tasks: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(i, connection)| {
            let offset = period.map(|p| p.mul_f64(i as f64 / writers as f64));
            tokio::spawn(write(
                connection,
                outbox.clone(),
                sequence.clone(),
                settings.aggregates.max(1),
                deadline,
                period.zip(offset),
            ))
        })
        .collect();
    let mut transaction_ms = Vec::new();
    let mut committed = Vec::new();
    for task in tasks {
        let (times, ids) = task.await??;
        transaction_ms.extend(times);
        committed.extend(ids);
    }
    let elapsed = started.elapsed();
    transaction_ms.sort_by(f64::total_cmp);
    Ok(WriteRate {
        commits: transaction_ms.len() as u64,
        elapsed,
        transaction_ms,
        committed,
    })
}

/// One writer: commits events until `deadline`, every `period` (after `offset`) if paced;
/// returns each transaction's time, ms, and each event's id with when its commit was answered.
async fn write(
    mut connection: PgConnection,
    outbox: PgOutbox,
    sequence: Arc<AtomicU64>,
    aggregates: u64,
    deadline: Instant,
    pacing: Option<(Duration, Duration)>,
) -> Result<Commits> {
    let mut ticker = pacing.map(|(period, offset)| {
        tokio::time::interval_at(tokio::time::Instant::now() + offset, period)
    });
    let mut times = Vec::new();
    let mut ids = Vec::new();
    loop {
        if let Some(ticker) = ticker.as_mut() {
            ticker.tick().await;
        }
        if Instant::now() >= deadline {
            break;
        }
        let began = Instant::now();
        let g = sequence.fetch_add(1, Ordering::Relaxed);
        let event = Event::new("order", format!("agg-{}", g % aggregates), "OrderPlaced")
            .json(&payload(g))?;
        let mut tx = connection.begin().await?;
        let id = outbox.enqueue(&mut tx, &event).await?;
        tx.commit().await?;
        ids.push((id, chrono::Utc::now()));
        times.push(began.elapsed().as_secs_f64() * 1000.0);
    }
    connection.close().await?;
    Ok((times, ids))
}

/// What one writer returns: its transactions' times, and its events with their commit times.
type Commits = (Vec<f64>, Vec<(uuid::Uuid, chrono::DateTime<chrono::Utc>)>);
