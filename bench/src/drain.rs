//! (a) `drain`: a backlog of N events drained by the real relay binary into JetStream (or
//! Kafka with `--broker kafka`).

use std::time::{Duration, Instant};

use crate::{
    common::{interruptible, Result, Scope},
    context::Bench,
    cost::{Cpu, DbCounters, DbWork, Meter},
    process::{MachineCpu, RelayProcess, RelayStats},
    progress::Progress,
};

/// How often the pending count is polled.
const POLL: Duration = Duration::from_millis(250);

/// Figures of one drain.
#[derive(Clone, Debug)]
pub struct DrainResult {
    /// Backlog size.
    pub events: u64,
    /// Average payload size, bytes.
    pub payload_bytes: f64,
    /// Time to insert the backlog.
    pub insert_time: Duration,
    /// From starting the relay process to a pending count of 0.
    pub drain_time: Duration,
    /// Throughput early and late in the drain.
    pub progress: Progress,
    /// Relay CPU time during the drain, in percent of one core.
    pub relay_cpu_percent: f64,
    /// Whole-machine CPU use during the drain (PostgreSQL + NATS + relay + polling).
    pub machine_cpu_percent: f64,
    /// Index entries read by scans: (index, scans, entries).
    pub index_reads: Vec<(String, i64, i64)>,
    /// Times the planner statistics were refreshed while the relay ran.
    pub analyzed: i64,
    /// Messages in the stream (or topic) afterwards.
    pub stream_messages: u64,
    /// The relay's memory, exit and log.
    pub relay: RelayStats,
    /// CPU per process over the drain.
    pub cpu: Cpu,
    /// What the database did over the drain.
    pub db: DbWork,
}

impl DrainResult {
    /// Events published per second.
    pub fn rate(&self) -> f64 {
        self.events as f64 / self.drain_time.as_secs_f64()
    }
}

/// Runs the scenario in its own schema and stream (or topic), removed afterwards.
pub async fn run(bench: &Bench) -> Result<DrainResult> {
    let scope = bench.scope("drain")?;
    bench.create_outbox(&scope).await?;
    let result = interruptible(async {
        bench.create_destination(&scope).await?;
        measure(bench, &scope).await
    })
    .await;
    bench.cleanup(&scope).await;
    result
}

async fn measure(bench: &Bench, scope: &Scope) -> Result<DrainResult> {
    measure_with(bench, scope, &[]).await
}

/// Inserts the backlog into `scope` and drains it with a relay process started with the
/// environment variables `env`.
pub async fn measure_with(
    bench: &Bench,
    scope: &Scope,
    env: &[(String, String)],
) -> Result<DrainResult> {
    let events = bench.options.events;
    bench.log(scope.scenario, format!("inserting {events} events"));
    let insert_time = bench.insert_backlog(scope, events).await?;
    let payload_bytes = bench.average_payload(scope).await?;
    bench.log(
        scope.scenario,
        format!(
            "inserted in {:.1}s; starting the relay",
            insert_time.as_secs_f64()
        ),
    );
    let analyzes_before = bench.analyze_count(scope).await?;
    let counters = DbCounters::take(&bench.pool, scope).await?;
    let mut meter = Meter::start(bench.processes(scope).await?);
    let machine_before = MachineCpu::now();
    let started = Instant::now();
    let mut relay =
        RelayProcess::start_with(bench, scope, &bench.options.database_url, env).await?;
    meter.set_relay(relay.pid());
    let timeout = Duration::from_secs(bench.options.drain_timeout);
    let mut last_report = Instant::now();
    let mut progress = Progress::new(events);
    let drain_time = loop {
        let pending = progress.poll(bench, scope, started.elapsed()).await?;
        if pending == 0 {
            break started.elapsed();
        }
        relay.check_alive()?;
        if started.elapsed() > timeout {
            let _ = relay.stop().await;
            return Err(format!("{pending} events still pending after {timeout:?}").into());
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            bench.log(scope.scenario, format!("{pending} pending"));
        }
        tokio::time::sleep(POLL).await;
    };
    let relay_cpu = relay.cpu_seconds();
    let cpu = meter.stop(events);
    let machine_cpu_percent = MachineCpu::now().busy_percent_since(&machine_before);
    let relay_stats = relay.stop().await?;
    let db = counters.since(&bench.pool, scope).await?;
    let stream_messages = bench.stream_messages(scope).await?;
    let index_reads = bench.index_reads(scope).await?;
    let analyzed = bench.analyze_count(scope).await? - analyzes_before;
    let result = DrainResult {
        events,
        payload_bytes,
        insert_time,
        drain_time,
        progress,
        relay_cpu_percent: 100.0 * relay_cpu / drain_time.as_secs_f64(),
        machine_cpu_percent,
        stream_messages,
        index_reads,
        analyzed,
        relay: relay_stats,
        cpu,
        db,
    };
    bench.log(
        scope.scenario,
        format!(
            "drained in {:.1}s ({:.0} events/s), stream holds {stream_messages}",
            drain_time.as_secs_f64(),
            result.rate()
        ),
    );
    Ok(result)
}
