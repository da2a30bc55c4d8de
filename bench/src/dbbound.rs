//! (b) `dbbound`: the PostgreSQL-alone limit. The same backlog claimed and marked published
//! through the relay's own store (`outbox_relayer::postgres::PgStore`), with no broker: the
//! relay's claim and completion statements at the relay's batch size and pipelining depth,
//! with its scan floors and its background statistics refresh.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use outbox_relayer::{
    postgres::PgStore,
    store::{Fence, Marking},
    RelayConfig,
};
use sqlx::postgres::PgPoolOptions;

use crate::{
    common::{interruptible, Result, Scope},
    context::Bench,
    cost::{Cpu, DbCounters, DbWork, Meter},
    process::MachineCpu,
    progress::Progress,
};

/// How often the pending count is polled, as in (a).
const POLL: Duration = Duration::from_millis(250);
/// Payload limit passed to the claim (the relay's default with NATS is about 1 MiB).
const MAX_PAYLOAD: usize = 1024 * 1024;

/// Figures of the database-bound run.
#[derive(Clone, Debug)]
pub struct DbBoundResult {
    /// Backlog size.
    pub events: u64,
    /// Events marked published (should equal `events`).
    pub marked: i64,
    /// Concurrent workers (each owns a disjoint share of the partitions).
    pub workers: usize,
    /// From the first claim to an empty backlog.
    pub time: Duration,
    /// Throughput early and late in the run.
    pub progress: Progress,
    /// Index entries read by scans: (index, scans, entries).
    pub index_reads: Vec<(String, i64, i64)>,
    /// Times the planner statistics were refreshed during the run (as the relay does).
    pub analyzed: i64,
    /// Whole-machine CPU use meanwhile.
    pub machine_cpu_percent: f64,
    /// CPU per process.
    pub cpu: Cpu,
    /// What the database did.
    pub db: DbWork,
}

impl DbBoundResult {
    /// Events claimed and marked per second.
    pub fn rate(&self) -> f64 {
        self.marked as f64 / self.time.as_secs_f64()
    }
}

/// Runs the scenario in its own schema, dropped afterwards.
pub async fn run(bench: &Bench) -> Result<DbBoundResult> {
    let scope = bench.scope("dbbound")?;
    bench.create_outbox(&scope).await?;
    let result = interruptible(measure(bench, &scope)).await;
    bench.cleanup_schema(&scope).await;
    result
}

async fn measure(bench: &Bench, scope: &Scope) -> Result<DbBoundResult> {
    let events = bench.options.events;
    bench.log(scope.scenario, format!("inserting {events} events"));
    let insert_time = bench.insert_backlog(scope, events).await?;
    bench.log(
        scope.scenario,
        format!(
            "inserted in {:.1}s; claiming and marking",
            insert_time.as_secs_f64()
        ),
    );
    let workers = bench.options.inflight.max(1);
    let pool = PgPoolOptions::new()
        .max_connections(workers as u32 + 1)
        .connect(&bench.options.database_url)
        .await?;
    let store = PgStore::open(pool, &scope.tables).await?;
    let relay_id = format!("bench-{}-dbbound", bench.run_id);
    let fences = store
        .acquire(
            &relay_id,
            i64::from(store.partitions()),
            Duration::from_secs(3600),
        )
        .await?;
    if fences.len() != store.partitions() as usize {
        return Err(format!(
            "acquired {} of {} partitions",
            fences.len(),
            store.partitions()
        )
        .into());
    }
    // Worker i owns partitions i, i + workers, i + 2 × workers, …
    let shares: Vec<Vec<Fence>> = (0..workers)
        .map(|i| fences.iter().copied().skip(i).step_by(workers).collect())
        .filter(|share: &Vec<Fence>| !share.is_empty())
        .collect();
    let analyzes_before = bench.analyze_count(scope).await?;
    let counters = DbCounters::take(&bench.pool, scope).await?;
    let meter = Meter::start(bench.processes(scope).await?);
    let machine_before = MachineCpu::now();
    let started = Instant::now();
    let stats = tokio::spawn(sample_stats(store.clone()));
    let tasks: Vec<_> = shares
        .into_iter()
        .map(|share| {
            tokio::spawn(worker(
                store.clone(),
                relay_id.clone(),
                share,
                bench.options.batch_size,
            ))
        })
        .collect();
    // Poll the pending count as (a) does: the same extra load, and the same progress figures.
    let mut progress = Progress::new(events);
    while !tasks.iter().all(|t| t.is_finished()) {
        progress.poll(bench, scope, started.elapsed()).await?;
        tokio::time::sleep(POLL).await;
    }
    let mut marked = 0;
    let mut finished = started;
    for task in tasks {
        let (n, at) = task.await??;
        marked += n;
        finished = finished.max(at);
    }
    let time = finished - started;
    let cpu = meter.stop(marked as u64);
    stats.abort();
    let machine_cpu_percent = MachineCpu::now().busy_percent_since(&machine_before);
    store.release(&relay_id, &fences).await?;
    store.pool().close().await;
    let db = counters.since(&bench.pool, scope).await?;
    let index_reads = bench.index_reads(scope).await?;
    let pending = bench.pending(scope).await?;
    if pending != 0 {
        return Err(format!("{pending} events still pending after the workers finished").into());
    }
    let result = DbBoundResult {
        events,
        marked,
        workers,
        time,
        progress,
        index_reads,
        analyzed: bench.analyze_count(scope).await? - analyzes_before,
        machine_cpu_percent,
        cpu,
        db,
    };
    bench.log(
        scope.scenario,
        format!(
            "{marked} events in {:.1}s ({:.0} events/s)",
            time.as_secs_f64(),
            result.rate()
        ),
    );
    Ok(result)
}

/// Claims and marks batches of its partitions until none is pending; returns the count marked
/// and when it found nothing left.
async fn worker(
    store: PgStore,
    relay_id: String,
    share: Vec<Fence>,
    batch: i64,
) -> Result<(i64, Instant)> {
    // Scan floors as the relay keeps them: each partition's scan starts at the lowest id its
    // previous claim found pending, all floors reset every `rescan_interval`, and the partition
    // order rotates on every claim. An empty claim is confirmed by a full scan.
    let rescan = RelayConfig::default().rescan_interval;
    let mut floors: HashMap<i32, i64> = HashMap::new();
    let mut full_scan_at = Instant::now();
    let mut order = share.clone();
    let mut marked = 0;
    loop {
        if full_scan_at.elapsed() >= rescan {
            floors.clear();
            full_scan_at = Instant::now();
        }
        order.rotate_left(1);
        let partitions: Vec<(i32, i64)> = order
            .iter()
            .map(|f| (f.0, floors.get(&f.0).copied().unwrap_or(0)))
            .collect();
        let rows = store
            .claim(&partitions, batch, MAX_PAYLOAD, i64::MAX)
            .await?
            .rows;
        if rows.is_empty() {
            if floors.is_empty() {
                return Ok((marked, Instant::now()));
            }
            floors.clear();
            continue;
        }
        let mut lowest = HashMap::new();
        for row in &rows {
            let id = lowest.entry(row.partition).or_insert(row.id);
            *id = (*id).min(row.id);
        }
        floors.extend(lowest);
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let n = store
            .mark_published(&relay_id, &share, &ids, Marking::Claimed)
            .await?
            .len() as i64;
        if n != ids.len() as i64 {
            return Err(format!("marked {n} of {} claimed events", ids.len()).into());
        }
        marked += n;
    }
}

/// What the relay's stats task does every `stats_interval`: sample the backlog and refresh the
/// planner statistics when the table changed a lot.
async fn sample_stats(store: PgStore) {
    let every = RelayConfig::default().stats_interval;
    loop {
        let _ = store.backlog().await;
        let _ = store.refresh_statistics().await;
        tokio::time::sleep(every).await;
    }
}
