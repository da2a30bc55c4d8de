//! (d) `steady`: the writers' maximum commit rate (NOTIFY on and off, relay not running), then
//! the relay under a fixed write rate: commit-to-delivery latency seen by a NATS subscriber,
//! whether the relay keeps up, and its memory.

use std::{
    collections::HashSet,
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
    common::{interruptible, wait_until, Bench, Result, Scope},
    process::{RelayProcess, RelayStats},
    writers::{self, WriteRate, WriterSettings},
};

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
    /// Target rate of the relay phase, events/s.
    pub target_rate: f64,
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
    /// Latencies in ms, sorted: receive time minus `occurred-at`.
    pub latencies_ms: Vec<f64>,
    /// Relay CPU during the writing phase, percent of one core.
    pub relay_cpu_percent: f64,
    /// The relay's memory, exit and log.
    pub relay: RelayStats,
}

impl SteadyResult {
    /// The `pending_at_end` bound for keeping up: 2 × rate × 0.1 s (at least 1).
    pub fn pending_limit(&self) -> f64 {
        (2.0 * self.target_rate * 0.1).max(1.0)
    }

    /// Whether the relay kept up: little pending at the end, drained within 5 s after.
    pub fn kept_up(&self) -> bool {
        (self.pending_at_end as f64) < self.pending_limit()
            && self.drain_after.is_some_and(|d| d <= DRAIN_AFTER_LIMIT)
    }

    /// The latency at quantile `q` (0..=1), ms.
    pub fn latency(&self, q: f64) -> Option<f64> {
        let n = self.latencies_ms.len();
        (n > 0).then(|| self.latencies_ms[((n - 1) as f64 * q).round() as usize])
    }
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
            "starting the relay; then {target_rate:.0} events/s for {:?}",
            settings.duration
        ),
    );

    let mut relay = RelayProcess::start(bench, scope).await?;
    wait_for_leases(bench, scope, &mut relay).await?;
    let subscriber = bench
        .nats()?
        .subscribe(format!("{}.>", scope.subjects))
        .await?;
    bench.nats()?.flush().await?;
    let received = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = oneshot::channel();
    let collector = tokio::spawn(collect(subscriber, received.clone(), stopped));

    let cpu_before = relay.cpu_seconds();
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
    let relay_stats = relay.stop().await?;
    let result = SteadyResult {
        writers: settings.writers,
        max_notify,
        max_silent,
        target_rate,
        written,
        max_pending,
        pending_at_end,
        drain_after,
        received: collected.distinct,
        duplicates: collected.duplicates,
        latencies_ms: collected.latencies_ms,
        relay_cpu_percent,
        relay: relay_stats,
    };
    bench.log(
        scope.scenario,
        format!(
            "wrote {} at {:.0}/s, received {}; p50 {:.1} ms, p99 {:.1} ms; kept up: {}",
            result.written.commits,
            result.written.per_second(),
            result.received,
            result.latency(0.5).unwrap_or(f64::NAN),
            result.latency(0.99).unwrap_or(f64::NAN),
            result.kept_up()
        ),
    );
    Ok(result)
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
    }
}
