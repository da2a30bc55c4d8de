//! (m) `mysql-beside`: MySQL or MariaDB next to the application. The application's own
//! inserts (four writers, one event per transaction, at `--rate`, default 500/s, for
//! `--steady-seconds`) timed from BEGIN to COMMIT in five phases of one sitting, each on a
//! database of its own holding the same rows (`--events`: half published two days ago, half
//! pending): alone; beside the relay binary draining the pending half into JetStream; beside
//! the operators' purge (`Admin::purge` with archive, in a loop) moving the old rows to the
//! archive; beside both; alone again (the spread of the baseline). Each phase reports the row
//! lock waits the server counted, which tell waiting on the outbox's locks from sharing the
//! machine's two cores.
//!
//! The target: the phase with both's p99 within 2× of the baseline's, no insert failing.
//! Reported with the relay's CPU per event drained.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use outbox::{mysql::MySqlOutbox, Event, Outbox, Tables};
use outbox_relayer::admin::Admin;
use sqlx::{mysql::MySqlConnectOptions, ConnectOptions, Connection, MySqlPool};

use crate::{
    common::{interruptible, Result},
    context::Bench,
    mysql::{insert, open, pending},
    process::RelayProcess,
};

/// The application's inserts in one phase.
#[derive(Clone, Debug, Default)]
pub struct Inserts {
    /// What ran beside them.
    pub beside: &'static str,
    /// BEGIN-to-COMMIT times of the transactions that committed, sorted, ms.
    pub latencies_ms: Vec<f64>,
    /// Transactions that failed (a lock wait timeout, a deadlock).
    pub failed: u64,
    /// Rows the purge archived meanwhile.
    pub purged: u64,
    /// Rows the relay published meanwhile, and its CPU seconds.
    pub relayed: (i64, f64),
    /// Row lock waits the server counted during the phase.
    pub lock_waits: i64,
}

impl Inserts {
    fn quantile(&self, q: f64) -> f64 {
        let n = self.latencies_ms.len();
        if n == 0 {
            return f64::NAN;
        }
        self.latencies_ms[((n - 1) as f64 * q).round() as usize]
    }
}

/// The phases: name, what runs beside the inserts, whether the relay drains, whether the
/// purge archives.
const PHASES: [(&str, &str, bool, bool); 5] = [
    ("alone", "nothing", false, false),
    ("relay", "the relay draining", true, false),
    ("purge", "purge --archive", false, true),
    ("both", "the relay draining + purge --archive", true, true),
    ("again", "nothing (again)", false, false),
];

/// The server's count of row lock waits (`Innodb_row_lock_waits`, server-wide).
async fn row_lock_waits(pool: &MySqlPool) -> Result<i64> {
    let (_, value): (String, String) =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_waits'")
            .fetch_one(pool)
            .await?;
    Ok(value.parse()?)
}

/// Runs the phases on databases of their own, dropped afterwards.
pub async fn run(bench: &Bench) -> Result<Vec<Inserts>> {
    let scope = bench.scope("mysql_beside")?;
    let server: MySqlConnectOptions = bench.options.mysql_url.parse()?;
    let names: Vec<String> = PHASES
        .iter()
        .map(|p| format!("{}_{}", scope.stream.to_lowercase(), p.0))
        .collect();
    let result = interruptible(async {
        bench.create_stream(&scope).await?;
        let mut admin = server.connect().await?;
        for name in &names {
            sqlx::raw_sql(&format!("CREATE DATABASE `{name}`"))
                .execute(&mut admin)
                .await?;
        }
        admin.close().await?;
        let base = bench
            .options
            .mysql_url
            .rsplit_once('/')
            .map_or(bench.options.mysql_url.as_str(), |(server, _)| server);
        let mut phases = Vec::new();
        for (&(_, beside, relay, purge), name) in PHASES.iter().zip(&names) {
            let pool = open(&server, name, &scope.tables).await?;
            seed(bench, &pool, &scope.tables).await?;
            bench.log(scope.scenario, format!("inserts beside {beside}"));
            let url = format!("{base}/{name}");
            let waits = row_lock_waits(&pool).await?;
            let mut phase =
                busy(bench, &scope, &pool, relay.then_some(url.as_str()), purge).await?;
            phase.beside = beside;
            phase.lock_waits = row_lock_waits(&pool).await? - waits;
            phases.push(phase);
            pool.close().await;
        }
        Ok(phases)
    })
    .await;
    bench.cleanup(&scope).await;
    if let Ok(mut admin) = server.connect().await {
        for name in &names {
            let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS `{name}`"))
                .execute(&mut admin)
                .await;
        }
    }
    result
}

/// `--events` rows, the first half published two days ago (the purge's), the rest pending
/// (the relay's).
async fn seed(bench: &Bench, pool: &MySqlPool, tables: &Tables) -> Result<()> {
    let n = bench.options.events;
    insert(bench, pool, tables, n).await?;
    let sql = tables.render_mysql(
        "UPDATE {events} SET status = 'published', \
         published_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY WHERE id <= ?",
    );
    sqlx::query(&sql)
        .bind(i64::try_from(n / 2)?)
        .execute(pool)
        .await?;
    sqlx::raw_sql(&tables.render_mysql("ANALYZE TABLE {events}"))
        .execute(pool)
        .await?;
    Ok(())
}

/// One phase: the application writes while the relay drains (given its URL) and the purge
/// archives (when `purge`), each or both or neither.
async fn busy(
    bench: &Bench,
    scope: &crate::common::Scope,
    pool: &MySqlPool,
    relay_url: Option<&str>,
    purge: bool,
) -> Result<Inserts> {
    let tables = &scope.tables;
    let before = pending(pool, tables).await?;
    let mut relay = match relay_url {
        Some(url) => Some(RelayProcess::start_on(bench, scope, url).await?),
        None => None,
    };
    let cpu = relay.as_ref().map_or(0.0, RelayProcess::cpu_seconds);
    let stop = Arc::new(AtomicBool::new(false));
    let purger = purge.then(|| {
        let admin = Admin::mysql(pool.clone(), tables);
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut archived = 0;
            while !stop.load(Ordering::Relaxed) {
                archived += admin
                    .purge(Duration::from_secs(86_400), 1000, true, |_| {})
                    .await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok::<u64, sqlx::Error>(archived)
        })
    });
    let mut phase = writes(bench, pool, tables).await?;
    stop.store(true, Ordering::Relaxed);
    if let Some(purger) = purger {
        phase.purged = purger.await??;
    }
    if let Some(mut relay) = relay.take() {
        relay.check_alive()?;
        let cpu = relay.cpu_seconds() - cpu;
        let left = pending(pool, tables).await?;
        relay.stop().await?;
        // Published: the backlog drained and the phase's own inserts, less what is pending.
        phase.relayed = (before + phase.latencies_ms.len() as i64 - left, cpu);
    }
    Ok(phase)
}

/// Four writers, one event per transaction, at `--rate` for `--steady-seconds`.
async fn writes(bench: &Bench, pool: &MySqlPool, tables: &Tables) -> Result<Inserts> {
    const WRITERS: u64 = 4;
    let rate = bench.options.rate.unwrap_or(500.0);
    let per_writer = (rate * bench.options.steady_seconds as f64 / WRITERS as f64) as u64;
    let failed = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (pool, tables, failed) = (pool.clone(), tables.clone(), failed.clone());
            let period = Duration::from_secs_f64(WRITERS as f64 / rate);
            tokio::spawn(async move {
                let outbox = MySqlOutbox::new(tables);
                let mut tick = tokio::time::interval(period);
                let mut times = Vec::with_capacity(per_writer as usize);
                for i in 0..per_writer {
                    tick.tick().await;
                    let event = Event::new("app", format!("w{w}-{}", i % 50), "Saved");
                    let started = Instant::now();
                    let done = async {
                        let mut tx = pool.begin().await?;
                        outbox
                            .enqueue(&mut tx, &event)
                            .await
                            .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
                        tx.commit().await
                    }
                    .await;
                    match done {
                        Ok(()) => times.push(started.elapsed().as_secs_f64() * 1000.0),
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                times
            })
        })
        .collect();
    let mut latencies_ms = Vec::new();
    for task in tasks {
        latencies_ms.extend(task.await?);
    }
    latencies_ms.sort_by(f64::total_cmp);
    Ok(Inserts {
        latencies_ms,
        failed: failed.load(Ordering::Relaxed),
        ..Default::default()
    })
}

/// The phases as a markdown table, with the busy phase's ratios to the baseline.
pub fn render(phases: &[Inserts], bench: &Bench) -> String {
    let rate = bench.options.rate.unwrap_or(500.0);
    let mut out = format!(
        "The application's inserts (four writers, one event per transaction, {rate:.0}/s for \
         {} s), BEGIN to COMMIT, on a table of {} rows (half published two days ago, half \
         pending):\n\n| beside | committed | failed | p50 ms | p99 ms | max ms | row lock waits | \
         archived | relay published | relay CPU µs/event |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        bench.options.steady_seconds, bench.options.events
    );
    for p in phases {
        let per_event = if p.relayed.0 > 0 {
            format!("{:.1}", p.relayed.1 * 1e6 / p.relayed.0 as f64)
        } else {
            "–".into()
        };
        out += &format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} |\n",
            p.beside,
            p.latencies_ms.len(),
            p.failed,
            p.quantile(0.5),
            p.quantile(0.99),
            p.latencies_ms.last().copied().unwrap_or(f64::NAN),
            p.lock_waits,
            p.purged,
            p.relayed.0,
            per_event
        );
    }
    if let ([alone, .., again], Some(both)) = (phases, phases.get(3)) {
        let base = alone.quantile(0.99).max(again.quantile(0.99));
        out += &format!(
            "\nBeside the relay and the purge, p99 is **{:.2}×** the worse of the two baselines \
             (p50 {:.2}×); target: at most 2×, no insert failing.\n",
            both.quantile(0.99) / base,
            both.quantile(0.5) / alone.quantile(0.5).max(again.quantile(0.5)),
        );
    }
    out
}
