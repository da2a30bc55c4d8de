//! (h) `mysql`: MySQL or MariaDB (`--mysql-url`). A backlog of N events in a database of its
//! own, drained by the real relay binary into JetStream, next to the MySQL-alone limit
//! measured in the same run: the same backlog, in a second database, claimed and marked
//! published through the relay's own `MySqlStore` over every partition at the relay's batch
//! size, with no broker. Then, with the relay still running, steady-state latency: events
//! committed at `--rate` (default 500/s) for `--steady-seconds`, each one's arrival at a NATS
//! subscriber minus its `occurred_at` (set by the database at insert). Then the drained rows
//! purged by the operators' purge next to one plain `DELETE` of the limit's rows. Both
//! databases are dropped afterwards.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use outbox::{mysql::MySqlOutbox, postgres::MigrateOptions, Event, Outbox, Tables};
use outbox_relayer::{
    admin::Admin,
    mysql::MySqlStore,
    store::{Marking, Store},
};
use sqlx::{
    mysql::{MySqlConnectOptions, MySqlPoolOptions},
    ConnectOptions, Connection, MySqlPool,
};

use crate::{
    common::{interruptible, payload, Result, Scope},
    context::Bench,
    process::{MachineCpu, RelayProcess},
    sqlite::{in_process, BacklogResult, Step},
    steady::collect,
};

/// Steady-state figures: a fixed write rate through the running relay.
#[derive(Clone, Debug)]
pub struct Latency {
    /// Target rate, events/s.
    pub rate: f64,
    /// Events committed.
    pub written: u64,
    /// How long the writing took.
    pub elapsed: Duration,
    /// Distinct events the subscriber got.
    pub received: usize,
    /// Commit-to-subscriber latencies, sorted, ms.
    pub latencies_ms: Vec<f64>,
    /// The relay's CPU meanwhile, percent of one core.
    pub relay_cpu_percent: f64,
}

impl Latency {
    fn quantile(&self, q: f64) -> f64 {
        let n = self.latencies_ms.len();
        if n == 0 {
            return f64::NAN;
        }
        self.latencies_ms[((n - 1) as f64 * q).round() as usize]
    }
}

/// How often the pending count is polled while the relay drains.
const POLL: Duration = Duration::from_millis(250);
/// Payload limit passed to the claim (the relay's default with NATS is about 1 MiB).
const MAX_PAYLOAD: usize = 1024 * 1024;
/// Rows per purge statement, as `outbox purge` and the relay's purge default to.
const PURGE_BATCH: i64 = 1000;

/// Runs the scenario on two databases of its own and its own stream, all removed afterwards.
pub async fn run(bench: &Bench) -> Result<(BacklogResult, Latency)> {
    let scope = bench.scope("mysql")?;
    let server: MySqlConnectOptions = bench.options.mysql_url.parse()?;
    let names = [
        format!("{}_drained", scope.stream.to_lowercase()),
        format!("{}_claimed", scope.stream.to_lowercase()),
    ];
    let result = interruptible(async {
        bench.create_stream(&scope).await?;
        let mut admin = server.connect().await?;
        for name in &names {
            sqlx::raw_sql(&format!("CREATE DATABASE `{name}`"))
                .execute(&mut admin)
                .await?;
        }
        admin.close().await?;
        measure(bench, &scope, &server, &names).await
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

pub(crate) async fn open(
    server: &MySqlConnectOptions,
    database: &str,
    tables: &Tables,
) -> Result<MySqlPool> {
    let pool = MySqlPoolOptions::new()
        .max_connections(4)
        .connect_with(server.clone().database(database))
        .await?;
    MySqlOutbox::new(tables.clone())
        .migrate(&pool, MigrateOptions::default())
        .await?;
    Ok(pool)
}

/// Writes the backlog: `n` events over `--aggregates` aggregates, ~200-byte JSON payloads,
/// 1000 per transaction.
pub(crate) async fn insert(
    bench: &Bench,
    pool: &MySqlPool,
    tables: &Tables,
    n: u64,
) -> Result<Duration> {
    let outbox = MySqlOutbox::new(tables.clone());
    let aggregates = bench.options.aggregates.max(1);
    let started = Instant::now();
    let mut from = 0;
    while from < n {
        let to = (from + 1000).min(n);
        let events: Vec<Event> = (from..to)
            .map(|g| {
                Event::new("order", format!("agg-{}", g % aggregates), "OrderPlaced")
                    .json(&payload(g))
            })
            .collect::<std::result::Result<_, _>>()?;
        let mut tx = pool.begin().await?;
        outbox.enqueue_batch(&mut tx, &events).await?;
        tx.commit().await?;
        from = to;
    }
    Ok(started.elapsed())
}

pub(crate) async fn pending(pool: &MySqlPool, tables: &Tables) -> Result<i64> {
    let sql = tables.render_mysql("SELECT count(*) FROM {events} WHERE status = 'pending'");
    Ok(sqlx::query_scalar(&sql).fetch_one(pool).await?)
}

async fn measure(
    bench: &Bench,
    scope: &Scope,
    server: &MySqlConnectOptions,
    names: &[String; 2],
) -> Result<(BacklogResult, Latency)> {
    let events = bench.options.events;
    let tables = &scope.tables;
    bench.log(
        scope.scenario,
        format!("writing {events} events to two databases"),
    );
    let drained_pool = open(server, &names[0], tables).await?;
    let insert_time = insert(bench, &drained_pool, tables, events).await?;
    let claimed_pool = open(server, &names[1], tables).await?;
    insert(bench, &claimed_pool, tables, events).await?;

    bench.log(scope.scenario, "draining with the relay");
    let base = bench
        .options
        .mysql_url
        .rsplit_once('/')
        .map_or(bench.options.mysql_url.as_str(), |(server, _)| server);
    let url = format!("{base}/{}", names[0]);
    let mut relay = RelayProcess::start_on(bench, scope, &url).await?;
    let machine = MachineCpu::now();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(bench.options.drain_timeout);
    while pending(&drained_pool, tables).await? > 0 {
        relay.check_alive()?;
        if Instant::now() > deadline {
            return Err("the relay did not drain the MySQL backlog in time".into());
        }
        tokio::time::sleep(POLL).await;
    }
    let drain = Step {
        time: started.elapsed(),
        cpu_seconds: relay.cpu_seconds(),
        machine_cpu_percent: MachineCpu::now().busy_percent_since(&machine),
    };
    let stream_messages = bench.stream_messages(scope).await?;
    let latency = steady(bench, scope, &drained_pool, &mut relay).await?;
    let relay = relay.stop().await?;

    bench.log(scope.scenario, "claiming and marking with MySqlStore alone");
    let store = MySqlStore::open(claimed_pool.clone(), tables).await?;
    let batch = bench.options.batch_size;
    let (marked, limit) = in_process(async {
        let relay_id = "bench-mysql-limit";
        let fences = store
            .acquire(
                relay_id,
                i64::from(store.partitions()),
                Duration::from_secs(600),
            )
            .await?;
        let mut marked = 0i64;
        let mut floor = 0;
        loop {
            let partitions: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, floor)).collect();
            let rows = store
                .claim(&partitions, batch, MAX_PAYLOAD, i64::MAX)
                .await?
                .rows;
            if rows.is_empty() {
                return Ok(marked);
            }
            floor = rows.iter().map(|r| r.id).max().unwrap_or(floor) + 1;
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            marked += store
                .mark_published(relay_id, &fences, &ids, Marking::Claimed)
                .await?
                .len() as i64;
        }
    })
    .await?;

    bench.log(
        scope.scenario,
        "purging the drained database, deleting the other",
    );
    let admin = Admin::mysql(drained_pool.clone(), tables);
    let (purged, purge) = in_process(async {
        Ok(admin
            .purge(Duration::ZERO, PURGE_BATCH, false, |_| {})
            .await?)
    })
    .await?;
    let delete_sql = tables.render_mysql("DELETE FROM {events} WHERE status = 'published'");
    let (deleted, delete) = in_process(async {
        Ok(sqlx::query(&delete_sql)
            .execute(&claimed_pool)
            .await?
            .rows_affected())
    })
    .await?;
    drained_pool.close().await;
    claimed_pool.close().await;
    let result = BacklogResult {
        events,
        insert_time,
        drain,
        stream_messages,
        relay,
        limit,
        marked,
        purge,
        purged,
        delete,
        deleted,
    };
    Ok((result, latency))
}

/// Commits events at `--rate` (four writers, one event per transaction) for
/// `--steady-seconds` while the relay runs, and measures each one's way to a subscriber.
async fn steady(
    bench: &Bench,
    scope: &Scope,
    pool: &MySqlPool,
    relay: &mut RelayProcess,
) -> Result<Latency> {
    let rate = bench.options.rate.unwrap_or(500.0);
    let seconds = bench.options.steady_seconds;
    bench.log(
        scope.scenario,
        format!("steady state: {rate:.0} events/s for {seconds} s"),
    );
    let subscriber = bench
        .nats()?
        .subscribe(format!("{}.>", scope.subjects))
        .await?;
    bench.nats()?.flush().await?;
    let received = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let collector = tokio::spawn(collect(subscriber, received.clone(), stopped));
    let cpu_before = relay.cpu_seconds();
    let started = Instant::now();
    const WRITERS: u64 = 4;
    let per_writer = (rate * seconds as f64 / WRITERS as f64) as u64;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (pool, tables) = (pool.clone(), scope.tables.clone());
            let period = Duration::from_secs_f64(WRITERS as f64 / rate);
            tokio::spawn(async move {
                let outbox = MySqlOutbox::new(tables);
                let mut tick = tokio::time::interval(period);
                for i in 0..per_writer {
                    tick.tick().await;
                    let event = Event::new("steady", format!("w{w}-{}", i % 50), "Ticked");
                    let mut tx = pool.begin().await?;
                    outbox.enqueue(&mut tx, &event).await?;
                    tx.commit().await?;
                }
                Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(per_writer)
            })
        })
        .collect();
    let mut written = 0;
    for task in tasks {
        written += task.await?.map_err(|e| e.to_string())?;
    }
    let elapsed = started.elapsed();
    let relay_cpu_percent = 100.0 * (relay.cpu_seconds() - cpu_before) / elapsed.as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) < written && Instant::now() < deadline {
        relay.check_alive()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    let collected = collector.await?;
    Ok(Latency {
        rate,
        written,
        elapsed,
        received: collected.distinct,
        latencies_ms: collected.latencies_ms,
        relay_cpu_percent,
    })
}

/// The steady-state figures as markdown.
pub fn render_latency(l: &Latency) -> String {
    format!(
        "Steady state through the running relay (default `poll_interval` of 1 s: MySQL has no \
         NOTIFY to wake it): {} events committed at {:.0}/s target ({:.0}/s achieved, four \
         writers, one event per transaction), {} received; commit to subscriber p50 **{:.0} \
         ms**, p99 **{:.0} ms**, worst {:.0} ms; relay CPU {:.1}% of a core, {:.0} µs per event.\n",
        l.written,
        l.rate,
        l.written as f64 / l.elapsed.as_secs_f64(),
        l.received,
        l.quantile(0.5),
        l.quantile(0.99),
        l.latencies_ms.last().copied().unwrap_or(f64::NAN),
        l.relay_cpu_percent,
        l.relay_cpu_percent / 100.0 * l.elapsed.as_secs_f64() * 1e6 / l.written.max(1) as f64,
    )
}

/// The server's version and durability settings, for the report.
pub async fn version(bench: &Bench) -> Result<String> {
    let server: MySqlConnectOptions = bench.options.mysql_url.parse()?;
    let mut conn = server.connect().await?;
    let (version, flush, sync): (String, i64, i64) = sqlx::query_as(
        "SELECT VERSION(), CAST(@@innodb_flush_log_at_trx_commit AS SIGNED), \
         CAST(@@sync_binlog AS SIGNED)",
    )
    .fetch_one(&mut conn)
    .await?;
    Ok(format!(
        "{version} (innodb_flush_log_at_trx_commit = {flush}, sync_binlog = {sync})"
    ))
}
