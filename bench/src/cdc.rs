//! (e) `cdc`: polling and the three CDC write modes side by side, in one run, on a PostgreSQL
//! with `wal_level = logical` (`--cdc-database-url`): for each mode, commit-to-delivery
//! latency at one fixed write rate on the fresh outbox (steady state), then the drain of a
//! backlog written while no relay runs, the database writes per event of that backlog (WAL
//! bytes, and row inserts, updates and deletes of the events table) and the table left behind.

use std::time::{Duration, Instant};

use outbox::{
    postgres::{cdc, PgOutbox, WriteMode},
    Event, Outbox,
};
use sqlx::Row;
use tokio::sync::oneshot;

use crate::{
    common::{interruptible, payload, wait_until, Result, Scope},
    context::Bench,
    process::{RelayProcess, RelayStats},
    steady::{collect, SLOW_MS},
    writers::{self, WriterSettings},
};

/// The modes compared, as (scenario name, CDC relay, write mode); `--modes` names them by
/// the scenario name's end.
const MODES: [(&str, bool, WriteMode); 4] = [
    ("cmp_poll", false, WriteMode::Table),
    ("cmp_cdc", true, WriteMode::Table),
    ("cmp_zero", true, WriteMode::ZeroGrowth),
    ("cmp_wal", true, WriteMode::WalOnly),
];

/// The modes `--modes` asks for (all when it is empty), or an error naming the unknown one.
fn chosen(asked: &[String]) -> Result<Vec<(&'static str, bool, WriteMode)>> {
    let named = |scenario: &str, m: &str| scenario.strip_prefix("cmp_") == Some(m);
    if let Some(bad) = asked
        .iter()
        .find(|m| !MODES.iter().any(|(s, _, _)| named(s, m)))
    {
        return Err(format!("--modes: unknown mode {bad:?} (poll, cdc, zero, wal)").into());
    }
    Ok(MODES
        .into_iter()
        .filter(|(s, _, _)| asked.is_empty() || asked.iter().any(|m| named(s, m)))
        .collect())
}

/// Figures of one mode.
#[derive(Clone, Debug)]
pub struct ModeResult {
    /// `poll`, `cdc`, `cdc zero-growth`, `cdc table-less`.
    pub name: &'static str,
    /// Backlog size.
    pub events: u64,
    /// Time to write the backlog through `PgOutbox` (4 writers, 1000 events per transaction).
    pub write_time: Duration,
    /// From starting the relay to every event in the stream.
    pub drain_time: Duration,
    /// WAL written per event, writes and relay together (backlog phase).
    pub wal_bytes_per_event: f64,
    /// Row inserts + updates + deletes of the events table per event (backlog phase).
    pub row_writes_per_event: f64,
    /// Rows in the events table after the whole run.
    pub rows_after: i64,
    /// Size of the events table with its indexes after the whole run, bytes.
    pub table_bytes_after: i64,
    /// The latency phase (the round with the median p99).
    pub steady: Steady,
    /// The relay process (drain).
    pub relay: RelayStats,
}

impl ModeResult {
    /// Drain throughput.
    pub fn rate_drain(&self) -> f64 {
        self.events as f64 / self.drain_time.as_secs_f64()
    }

    /// Latency at quantile `q`, ms.
    pub fn latency(&self, q: f64) -> Option<f64> {
        quantile(&self.steady.latencies_ms, q)
    }
}

/// Runs every mode, each in its own schema, slot and stream: first the steady-state latency
/// of every mode (on fresh outboxes, before any backlog), then the backlog drain of every
/// mode, each after [`Bench::settle`]. A latency phase never follows another mode's
/// million-event drain and cleanup, whose checkpoint and vacuum would weigh on it.
pub async fn run(bench: &Bench) -> Result<Vec<ModeResult>> {
    let mut scopes = Vec::new();
    let result = interruptible(async {
        for (scenario, is_cdc, mode) in chosen(&bench.options.modes)? {
            let mut scope = bench.scope(scenario)?;
            scope.cdc = is_cdc;
            bench.create_outbox(&scope).await?;
            scopes.push((scope, mode));
            let (scope, _) = scopes.last().expect("pushed");
            if is_cdc {
                cdc::setup(&bench.pool, &scope.tables, &names(scope)).await?;
            }
            bench.create_stream(scope).await?;
        }
        let mut rounds: Vec<Vec<Steady>> = scopes.iter().map(|_| Vec::new()).collect();
        for _ in 0..bench.options.rounds.max(1) {
            for ((scope, mode), done) in scopes.iter().zip(rounds.iter_mut()) {
                bench.settle(scope.scenario).await;
                done.push(steady_state(bench, scope, *mode).await?);
            }
        }
        let steady: Vec<Steady> = rounds.into_iter().map(Steady::median).collect();
        // An idle slot keeps every byte of WAL the other modes' backlogs write (past
        // `max_slot_wal_keep_size` PostgreSQL invalidates it): each drain gets a fresh slot.
        for (scope, _) in scopes.iter().filter(|(s, _)| s.cdc) {
            cdc::drop(&bench.pool, &scope.tables, &names(scope)).await?;
        }
        let mut out = Vec::new();
        for ((scope, mode), steady) in scopes.iter().zip(steady) {
            bench.settle(scope.scenario).await;
            out.push(drain(bench, scope, *mode, steady).await?);
        }
        Ok(out)
    })
    .await;
    for (scope, _) in &scopes {
        if scope.cdc {
            if let Err(e) = cdc::drop(&bench.pool, &scope.tables, &names(scope)).await {
                bench.log(scope.scenario, format!("could not drop the slot: {e}"));
            }
        }
        bench.cleanup(scope).await;
    }
    result
}

fn names(scope: &Scope) -> cdc::CdcNames {
    cdc::CdcNames::for_tables(&scope.tables)
}

/// The writers' outbox: a CDC relay is woken by the stream, so its writers send no NOTIFY
/// (whose commits PostgreSQL serialises on one lock); polling keeps it.
fn writer(scope: &Scope, mode: WriteMode) -> PgOutbox {
    PgOutbox::new(scope.tables.clone())
        .write_mode(mode)
        .notify(!scope.cdc)
}

fn label(scope: &Scope, mode: WriteMode) -> &'static str {
    match (scope.cdc, mode) {
        (false, _) => "poll",
        (true, WriteMode::ZeroGrowth) => "cdc zero-growth",
        (true, WriteMode::WalOnly) => "cdc table-less",
        (true, _) => "cdc",
    }
}

/// The latency phase of one mode.
#[derive(Clone, Debug)]
pub struct Steady {
    /// Fixed write rate, events/s (one event per transaction).
    pub rate: f64,
    /// Latencies (occurred-at to the subscriber), ms, sorted.
    pub latencies_ms: Vec<f64>,
    /// Distinct events the subscriber got, and how many were written.
    pub received: (usize, u64),
    /// Lowest and highest p99 over the rounds, ms.
    pub p99_range: (f64, f64),
    /// Rounds run.
    pub rounds: usize,
}

impl Steady {
    /// The round with the median p99 (with every round's p99 range).
    fn median(mut rounds: Vec<Steady>) -> Steady {
        let p99 = |s: &Steady| quantile(&s.latencies_ms, 0.99).unwrap_or(f64::NAN);
        rounds.sort_by(|a, b| p99(a).total_cmp(&p99(b)));
        let range = (
            rounds.first().map_or(f64::NAN, p99),
            rounds.last().map_or(f64::NAN, p99),
        );
        let n = rounds.len();
        let mut median = rounds.swap_remove(n / 2);
        median.p99_range = range;
        median.rounds = n;
        median
    }
}

/// The relay running, writers at a fixed rate (one event per transaction), commit-to-delivery
/// latency at a NATS subscriber.
async fn steady_state(bench: &Bench, scope: &Scope, mode: WriteMode) -> Result<Steady> {
    let name = label(scope, mode);
    let outbox = writer(scope, mode);
    let rate = bench.options.rate.unwrap_or(1000.0);
    let mut relay = RelayProcess::start(bench, scope).await?;
    let subscriber = bench
        .nats()?
        .subscribe(format!("{}.>", scope.subjects))
        .await?;
    bench.nats()?.flush().await?;
    let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (stop, stopped) = oneshot::channel();
    let subscribed = Instant::now();
    let collector = tokio::spawn(collect(subscriber, received.clone(), stopped));
    // The relay is ready once a probe event comes through.
    write_backlog(bench, &outbox, 1).await?;
    let counter = &received;
    wait_until(
        Duration::from_millis(20),
        Duration::from_secs(60),
        || async move { Ok(counter.load(std::sync::atomic::Ordering::Relaxed) >= 1) },
    )
    .await?;
    relay.check_alive()?;
    let settings = WriterSettings {
        database_url: bench.options.database_url.clone(),
        writers: bench.options.writers,
        aggregates: bench.options.aggregates,
        duration: Duration::from_secs(bench.options.steady_seconds),
        rate: Some(rate),
    };
    bench.log(
        scope.scenario,
        format!("{name}: {rate:.0} events/s for {:?}", settings.duration),
    );
    let probe_s = subscribed.elapsed().as_secs_f64();
    let scans_before = scans(bench, scope).await?;
    let written = writers::run(&settings, &outbox).await?;
    wait_until(
        Duration::from_millis(50),
        Duration::from_secs(30),
        || async move { Ok(counter.load(std::sync::atomic::Ordering::Relaxed) > written.commits) },
    )
    .await?;
    let _ = stop.send(());
    let collected = collector.await?;
    let _ = relay.stop().await?;
    let scans_after = scans(bench, scope).await?;
    // The probe is not a sample of the fixed-rate phase: it waited for the relay to start, so
    // its latency is the largest one.
    let received = (collected.distinct.saturating_sub(1), written.commits);
    let (slow, first_slow, last_slow) = collected.slow;
    let mut latencies_ms = collected.latencies_ms;
    if !latencies_ms.is_empty() {
        latencies_ms.remove(latencies_ms.len() - 1);
    }
    bench.log(
        scope.scenario,
        format!(
            "{name}: p50 {:.1} ms, p99 {:.1} ms (the writers' transactions: {:.1} / {:.1} ms); \
             {slow} over {SLOW_MS} ms (arriving {first_slow:.1}–{last_slow:.1} s in; the probe \
             through {probe_s:.2} s in), {} duplicates; {} sequential and {} index scans of the \
             events table",
            quantile(&latencies_ms, 0.5).unwrap_or(f64::NAN),
            quantile(&latencies_ms, 0.99).unwrap_or(f64::NAN),
            quantile(&written.transaction_ms, 0.5).unwrap_or(f64::NAN),
            quantile(&written.transaction_ms, 0.99).unwrap_or(f64::NAN),
            collected.duplicates,
            scans_after.0 - scans_before.0,
            scans_after.1 - scans_before.1,
        ),
    );
    Ok(Steady {
        rate,
        latencies_ms,
        received,
        p99_range: (f64::NAN, f64::NAN),
        rounds: 1,
    })
}

/// A backlog written while no relay runs (the slot keeps it), then drained.
async fn drain(
    bench: &Bench,
    scope: &Scope,
    mode: WriteMode,
    steady: Steady,
) -> Result<ModeResult> {
    let events = bench.options.events;
    let name = label(scope, mode);
    let outbox = writer(scope, mode);
    if scope.cdc {
        cdc::setup(&bench.pool, &scope.tables, &names(scope)).await?;
    }
    let before = bench.stream_messages(scope).await?;
    let wal_before = wal_lsn(bench).await?;
    let rows_before = row_writes(bench, scope).await?;
    bench.log(scope.scenario, format!("{name}: writing {events} events"));
    let started = Instant::now();
    write_backlog(bench, &outbox, events).await?;
    let write_time = started.elapsed();
    bench.log(
        scope.scenario,
        format!(
            "written in {:.1}s; starting the relay",
            write_time.as_secs_f64()
        ),
    );
    let started = Instant::now();
    let mut relay = RelayProcess::start(bench, scope).await?;
    let timeout = Duration::from_secs(bench.options.drain_timeout);
    loop {
        if bench.stream_messages(scope).await? >= before + events {
            break;
        }
        relay.check_alive()?;
        if started.elapsed() > timeout {
            let _ = relay.stop().await;
            return Err(format!("{name}: not drained after {timeout:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drain_time = started.elapsed();
    // Until the relay marked what it published (poll, cdc): its writes count too.
    let pending_sql = scope
        .tables
        .render("SELECT count(*) FROM {schema}.{events} WHERE status = 'pending'");
    wait_until(Duration::from_millis(50), Duration::from_secs(60), || {
        let sql = pending_sql.clone();
        async move {
            let n: i64 = sqlx::query_scalar(&sql).fetch_one(&bench.pool).await?;
            Ok(n == 0)
        }
    })
    .await?;
    let relay = relay.stop().await?;
    // PostgreSQL flushes table statistics about once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let wal_bytes_per_event = (wal_lsn(bench).await? - wal_before) as f64 / events as f64;
    let row_writes_per_event =
        (row_writes(bench, scope).await? - rows_before) as f64 / events as f64;
    let size = sqlx::query(&scope.tables.render(
        "SELECT count(*), pg_total_relation_size('{schema}.{events}'::regclass) \
         FROM {schema}.{events}",
    ))
    .fetch_one(&bench.pool)
    .await?;
    let result = ModeResult {
        name,
        events,
        write_time,
        drain_time,
        wal_bytes_per_event,
        row_writes_per_event,
        rows_after: size.get(0),
        table_bytes_after: size.get(1),
        steady,
        relay,
    };
    bench.log(
        scope.scenario,
        format!(
            "{name}: drained in {:.1}s ({:.0}/s); {wal_bytes_per_event:.0} WAL bytes and \
             {row_writes_per_event:.2} row writes per event; {} rows left",
            drain_time.as_secs_f64(),
            result.rate_drain(),
            result.rows_after
        ),
    );
    Ok(result)
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    (n > 0).then(|| sorted[((n - 1) as f64 * q).round() as usize])
}

/// Writes `n` events with 4 writers in transactions of 1000.
async fn write_backlog(bench: &Bench, outbox: &PgOutbox, n: u64) -> Result<()> {
    const WRITERS: u64 = 4;
    const PER_TX: u64 = 1000;
    let aggregates = bench.options.aggregates.max(1);
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let pool = bench.pool.clone();
            let outbox = outbox.clone();
            tokio::spawn(async move {
                let mut g = w * PER_TX;
                while g < n {
                    let end = (g + PER_TX).min(n);
                    let events: Vec<Event> = (g..end)
                        .map(|i| {
                            Event::new("order", format!("agg-{}", i % aggregates), "OrderPlaced")
                                .json(&payload(i))
                        })
                        .collect::<std::result::Result<_, _>>()?;
                    let mut tx = pool.begin().await?;
                    outbox.enqueue_batch(&mut tx, &events).await?;
                    tx.commit().await?;
                    g += WRITERS * PER_TX;
                }
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn wal_lsn(bench: &Bench) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint")
            .fetch_one(&bench.pool)
            .await?,
    )
}

/// Sequential and index scans of the events table so far (a plan that scans the table on
/// every write or mark shows here).
async fn scans(bench: &Bench, scope: &Scope) -> Result<(i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0) \
         FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
    )
    .bind(scope.tables.schema().as_str())
    .bind(scope.tables.events().as_str())
    .fetch_one(&bench.pool)
    .await?)
}

async fn row_writes(bench: &Bench, scope: &Scope) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint \
         FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
    )
    .bind(scope.tables.schema().as_str())
    .bind(scope.tables.events().as_str())
    .fetch_one(&bench.pool)
    .await?)
}

/// The comparison as a markdown table.
pub fn render(results: &[ModeResult]) -> String {
    let mut out = String::from(
        "| mode | drain (events/s) | write backlog (s) | WAL bytes / event | row writes / event \
         | p50 ms | p99 ms | p99 over rounds | received | rows after | table after | relay peak RSS |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in results {
        out.push_str(&format!(
            "| {} | {:.0} | {:.1} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1}–{:.1} ({}) | {}/{} at {:.0}/s | {} | {:.1} MB | {:.1} MB |\n",
            r.name,
            r.rate_drain(),
            r.write_time.as_secs_f64(),
            r.wal_bytes_per_event,
            r.row_writes_per_event,
            r.latency(0.5).unwrap_or(f64::NAN),
            r.latency(0.99).unwrap_or(f64::NAN),
            r.steady.p99_range.0,
            r.steady.p99_range.1,
            r.steady.rounds,
            r.steady.received.0,
            r.steady.received.1,
            r.steady.rate,
            r.rows_after,
            r.table_bytes_after as f64 / 1e6,
            r.relay.peak_rss_mb,
        ));
    }
    out
}
