//! (d) `steady`: the writers' maximum commit rate (NOTIFY on and off, relay not running), then
//! the relay under a fixed write rate, its writers with NOTIFY on and then off: commit-to-
//! delivery latency seen by a NATS subscriber, whether the relay keeps up, and its memory.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use outbox::postgres::PgOutbox;
use tokio::sync::oneshot;

use crate::{
    common::{interruptible, wait_until, Result, Scope},
    context::Bench,
    cost::{Cpu, DbCounters, DbWork, Meter},
    process::{RelayProcess, RelayStats},
    writers::{self, WriteRate, WriterSettings},
};

/// The first seconds of a fixed-rate phase left out of its commit-to-delivery figures.
const WARM_UP_SECONDS: i64 = 1;

/// Longest wait for the backlog to empty once the writers stop, to count as keeping up.
pub const DRAIN_AFTER_LIMIT: Duration = Duration::from_secs(5);

/// Figures of the steady-state scenario.
#[derive(Clone, Debug)]
pub struct SteadyResult {
    /// Concurrent writers.
    pub writers: usize,
    /// Maximum commit rate with NOTIFY on (the default).
    pub max_notify: WriteRate,
    /// Maximum commit rate with `.notify(false)`.
    pub max_silent: WriteRate,
    /// Target rate of the relay phases, events/s.
    pub target_rate: f64,
    /// The fixed-rate phases with the relay running: writers with NOTIFY on, then off.
    pub phases: Vec<FixedRate>,
    /// The relay's memory, exit and log.
    pub relay: RelayStats,
}

/// One fixed-rate phase: paced writers, the relay running, a subscriber timing each event.
#[derive(Clone, Debug)]
pub struct FixedRate {
    /// Whether the writers sent the NOTIFY.
    pub notify: bool,
    /// What the paced writers achieved.
    pub written: WriteRate,
    /// Largest pending count sampled while writing.
    pub max_pending: i64,
    /// Pending count when the writers stopped.
    pub pending_at_end: i64,
    /// Time from the writers' stop to an empty backlog (`None`: not within 30 s).
    pub drain_after: Option<Duration>,
    /// Messages the subscriber received, distinct event ids.
    pub received: usize,
    /// Messages received more than once.
    pub duplicates: usize,
    /// Latencies in ms, sorted: receive time minus `occurred-at` (set at insert, before the
    /// commit).
    pub latencies_ms: Vec<f64>,
    /// Latencies in ms, sorted: receive time minus the moment the writer's commit was
    /// answered (commit to delivery), for the events committed after the warm-up second.
    pub commit_latencies_ms: Vec<f64>,
    /// Deliveries over 100 ms after their insert, and when the first and last of them
    /// arrived (seconds into the phase): one stall, or slowness throughout.
    pub slow: (usize, f64, f64),
    /// Relay CPU during the writing, percent of one core.
    pub relay_cpu_percent: f64,
    /// CPU per process over the writing (writers, relay, broker, subscriber).
    pub cpu: Cpu,
    /// What the database did over the writing.
    pub db: DbWork,
}

impl FixedRate {
    /// The `pending_at_end` bound for keeping up at `rate`: 2 × rate × 0.1 s (at least 1).
    pub fn pending_limit(&self, rate: f64) -> f64 {
        (2.0 * rate * 0.1).max(1.0)
    }

    /// Whether the relay kept up at `rate`: little pending at the end, drained within 5 s.
    pub fn kept_up(&self, rate: f64) -> bool {
        (self.pending_at_end as f64) < self.pending_limit(rate)
            && self.drain_after.is_some_and(|d| d <= DRAIN_AFTER_LIMIT)
    }

    /// The occurred-at latency at quantile `q` (0..=1), ms.
    pub fn latency(&self, q: f64) -> Option<f64> {
        quantile(&self.latencies_ms, q)
    }

    /// The commit-to-delivery latency at quantile `q` (0..=1), ms.
    pub fn commit_latency(&self, q: f64) -> Option<f64> {
        quantile(&self.commit_latencies_ms, q)
    }
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    (n > 0).then(|| sorted[((n - 1) as f64 * q).round() as usize])
}

/// Runs the scenario in its own schema and stream, removed afterwards.
pub async fn run(bench: &Bench) -> Result<SteadyResult> {
    let scope = bench.scope("steady")?;
    bench.create_outbox(&scope).await?;
    let result = interruptible(async {
        bench.create_stream(&scope).await?;
        measure(bench, &scope).await
    })
    .await;
    bench.cleanup(&scope).await;
    result
}

async fn measure(bench: &Bench, scope: &Scope) -> Result<SteadyResult> {
    let options = &bench.options;
    let mut settings = WriterSettings {
        database_url: options.database_url.clone(),
        writers: options.writers,
        aggregates: options.aggregates,
        duration: Duration::from_secs(options.write_seconds),
        rate: None,
    };
    let outbox = PgOutbox::new(scope.tables.clone());
    let mut max = Vec::new();
    for notify in [true, false] {
        bench.log(
            scope.scenario,
            format!(
                "{} writers at full speed for {:?}, NOTIFY {}",
                settings.writers,
                settings.duration,
                if notify { "on" } else { "off" }
            ),
        );
        let rate = writers::run(&settings, &outbox.clone().notify(notify)).await?;
        bench.log(
            scope.scenario,
            format!("{:.0} commits/s", rate.per_second()),
        );
        max.push(rate);
        truncate(bench, scope).await?;
    }
    let mut max = max.into_iter();
    let (max_notify, max_silent) = (max.next().expect("notify on"), max.next().expect("off"));
    let target_rate = options
        .rate
        .unwrap_or(max_notify.per_second() * options.rate_fraction);
    settings.duration = Duration::from_secs(options.steady_seconds);
    settings.rate = Some(target_rate);
    bench.log(
        scope.scenario,
        format!(
            "starting the relay; then {target_rate:.0} events/s for {:?}, NOTIFY on, then off",
            settings.duration
        ),
    );
    let mut relay = RelayProcess::start(bench, scope).await?;
    wait_for_leases(bench, scope, &mut relay).await?;
    let mut phases = Vec::new();
    for notify in [true, false] {
        let outbox = outbox.clone().notify(notify);
        let phase = fixed_rate(bench, scope, &mut relay, &settings, &outbox, notify).await?;
        bench.log(
            scope.scenario,
            format!(
                "NOTIFY {}: wrote {} at {:.0}/s, received {}; commit to delivery p50 {:.1} ms, \
                 p99 {:.1} ms; kept up: {}; {} over 100 ms, arriving {:.1}–{:.1} s in",
                if notify { "on" } else { "off" },
                phase.written.commits,
                phase.written.per_second(),
                phase.received,
                phase.commit_latency(0.5).unwrap_or(f64::NAN),
                phase.commit_latency(0.99).unwrap_or(f64::NAN),
                phase.kept_up(target_rate),
                phase.slow.0,
                phase.slow.1,
                phase.slow.2
            ),
        );
        phases.push(phase);
    }
    let relay_stats = relay.stop().await?;
    Ok(SteadyResult {
        writers: settings.writers,
        max_notify,
        max_silent,
        target_rate,
        phases,
        relay: relay_stats,
    })
}

/// One fixed-rate phase against the running relay.
async fn fixed_rate(
    bench: &Bench,
    scope: &Scope,
    relay: &mut RelayProcess,
    settings: &WriterSettings,
    outbox: &PgOutbox,
    notify: bool,
) -> Result<FixedRate> {
    let subscriber = bench
        .nats()?
        .subscribe(format!("{}.>", scope.subjects))
        .await?;
    bench.nats()?.flush().await?;
    let received = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = oneshot::channel();
    let collector = tokio::spawn(collect(subscriber, received.clone(), stopped));
    let cpu_before = relay.cpu_seconds();
    let counters = DbCounters::take(&bench.pool, scope).await?;
    let mut meter = Meter::start(bench.processes(scope).await?);
    meter.set_relay(relay.pid());
    // Commit-to-delivery is taken after a warm-up second: a relay idle before the phase finds
    // the first events of writers that do not NOTIFY on its next poll (up to `poll_interval`),
    // which is not the steady state (the occurred-at figures include it).
    let warm = chrono::Utc::now() + chrono::Duration::seconds(WARM_UP_SECONDS);
    let writing = {
        let settings = settings.clone();
        let outbox = outbox.clone();
        tokio::spawn(async move { writers::run(&settings, &outbox).await })
    };
    let mut max_pending = 0;
    while !writing.is_finished() {
        max_pending = max_pending.max(bench.pending(scope).await?);
        relay.check_alive()?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let written = writing.await??;
    let cpu = meter.stop(written.commits);
    let pending_at_end = bench.pending(scope).await?;
    let relay_cpu_percent =
        100.0 * (relay.cpu_seconds() - cpu_before) / written.elapsed.as_secs_f64();
    let drain_after = wait_until(
        Duration::from_millis(50),
        Duration::from_secs(30),
        || async move { Ok(bench.pending(scope).await? == 0) },
    )
    .await?;
    // Let the last messages reach the subscriber.
    let counter = &received;
    wait_until(
        Duration::from_millis(50),
        Duration::from_secs(5),
        || async move { Ok(counter.load(Ordering::Relaxed) >= written.commits) },
    )
    .await?;
    let _ = stop.send(());
    let collected = collector.await?;
    let db = counters.since(&bench.pool, scope).await?;
    let mut commit_latencies_ms: Vec<f64> = written
        .committed
        .iter()
        .filter(|(_, at)| *at >= warm)
        .filter_map(|(id, at)| {
            let arrived = collected.arrivals.get(id)?;
            Some((*arrived - *at).num_microseconds()? as f64 / 1000.0)
        })
        .collect();
    commit_latencies_ms.sort_by(f64::total_cmp);
    Ok(FixedRate {
        notify,
        written,
        max_pending,
        pending_at_end,
        drain_after,
        received: collected.distinct,
        duplicates: collected.duplicates,
        latencies_ms: collected.latencies_ms,
        commit_latencies_ms,
        slow: collected.slow,
        relay_cpu_percent,
        cpu,
        db,
    })
}

/// Empties the events table between measurements.
async fn truncate(bench: &Bench, scope: &Scope) -> Result<()> {
    sqlx::raw_sql(&format!("TRUNCATE {}", scope.events_table()))
        .execute(&bench.pool)
        .await?;
    Ok(())
}

/// Waits until the relay holds every partition, so the measurement starts with it running.
async fn wait_for_leases(bench: &Bench, scope: &Scope, relay: &mut RelayProcess) -> Result<()> {
    let sql = scope.tables.render(
        "SELECT count(*) = (SELECT partitions FROM {schema}.meta)
         FROM {schema}.leases WHERE owner IS NOT NULL AND expires_at > now()",
    );
    let started = Instant::now();
    loop {
        relay.check_alive()?;
        let ready: bool = sqlx::query_scalar(&sql).fetch_one(&bench.pool).await?;
        if ready {
            bench.log(
                scope.scenario,
                format!("relay holds all partitions after {:?}", started.elapsed()),
            );
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err("the relay did not acquire its partitions within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the subscriber saw.
pub(crate) struct Collected {
    pub(crate) distinct: usize,
    pub(crate) duplicates: usize,
    pub(crate) latencies_ms: Vec<f64>,
    /// Messages that took over [`SLOW_MS`], and when the first and last of them arrived
    /// (seconds since the collector started): one stall, or slowness throughout.
    pub(crate) slow: (usize, f64, f64),
    /// When each event (by id) first arrived.
    pub(crate) arrivals: HashMap<uuid::Uuid, chrono::DateTime<chrono::Utc>>,
}

/// A latency over this counts in [`Collected::slow`].
pub(crate) const SLOW_MS: f64 = 100.0;

/// Records, for every message, its receive time minus its `occurred-at` header, until `stop`.
pub(crate) async fn collect(
    mut subscriber: async_nats::Subscriber,
    received: Arc<AtomicU64>,
    mut stop: oneshot::Receiver<()>,
) -> Collected {
    let mut seen = HashSet::new();
    let mut arrivals = HashMap::new();
    let mut duplicates = 0;
    let mut latencies_ms = Vec::new();
    let started = std::time::Instant::now();
    let mut slow = (0, f64::NAN, f64::NAN);
    loop {
        let message = tokio::select! {
            _ = &mut stop => break,
            message = subscriber.next() => match message {
                Some(message) => message,
                None => break,
            },
        };
        let now = chrono::Utc::now();
        let Some(headers) = message.headers.as_ref() else {
            continue;
        };
        if let Some(id) = headers.get("event-id") {
            if !seen.insert(id.as_str().to_owned()) {
                duplicates += 1;
                continue;
            }
            if let Ok(id) = id.as_str().parse() {
                arrivals.insert(id, now);
            }
        }
        received.fetch_add(1, Ordering::Relaxed);
        let occurred = headers
            .get("occurred-at")
            .and_then(|v| chrono::DateTime::parse_from_rfc3339(v.as_str()).ok());
        if let Some(occurred) = occurred {
            let micros = (now - occurred.with_timezone(&chrono::Utc))
                .num_microseconds()
                .unwrap_or(i64::MAX);
            let ms = micros as f64 / 1000.0;
            if ms > SLOW_MS {
                let at = started.elapsed().as_secs_f64();
                if slow.0 == 0 {
                    slow.1 = at;
                }
                slow = (slow.0 + 1, slow.1, at);
            }
            latencies_ms.push(ms);
        }
    }
    latencies_ms.sort_by(f64::total_cmp);
    Collected {
        distinct: seen.len(),
        duplicates,
        latencies_ms,
        slow,
        arrivals,
    }
}
