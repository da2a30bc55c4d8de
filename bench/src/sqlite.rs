//! (g) `sqlite`: the embedded default. A backlog of N events in a SQLite file (in `--out`)
//! drained by the real relay binary into JetStream, next to the SQLite-alone limit measured in
//! the same run: the same backlog claimed and marked published through the relay's own
//! `SqliteStore` at the relay's batch size, with no broker. Then the N published rows purged
//! by the operators' purge (`outbox_relayer::admin::Admin`, batches of 1000, what `outbox purge`
//! and `purge_retention` run) next to one plain `DELETE` of the same rows.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use outbox::{sqlite::SqliteOutbox, Event, Outbox, Tables};
use outbox_relayer::{
    admin::Admin,
    sqlite::SqliteStore,
    store::{Marking, Store},
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use crate::{
    common::{interruptible, payload, Result, Scope},
    context::Bench,
    process::{process_cpu_seconds, MachineCpu, RelayProcess, RelayStats},
};

/// How often the pending count is polled while the relay drains.
const POLL: Duration = Duration::from_millis(250);
/// Payload limit passed to the claim (the relay's default with NATS is about 1 MiB).
const MAX_PAYLOAD: usize = 1024 * 1024;
/// Rows per purge statement, as `outbox purge` and the relay's purge default to.
const PURGE_BATCH: i64 = 1000;

/// One measured step: its time and the CPU of the process doing it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Step {
    /// Wall time.
    pub time: Duration,
    /// CPU seconds (user + system) of the process that did the work.
    pub cpu_seconds: f64,
    /// Whole-machine CPU use meanwhile, percent of all cores.
    pub machine_cpu_percent: f64,
}

/// Figures of a backlog run on one database (SQLite, MySQL): drain, database-alone limit,
/// purge.
#[derive(Clone, Debug)]
pub struct BacklogResult {
    /// Backlog size.
    pub events: u64,
    /// Time to write one backlog (batches of 1000 per transaction, through `SqliteOutbox`).
    pub insert_time: Duration,
    /// The relay process draining the backlog into JetStream.
    pub drain: Step,
    /// Messages in the stream afterwards.
    pub stream_messages: u64,
    /// The relay's memory, exit and log.
    pub relay: RelayStats,
    /// The same backlog claimed and marked through `SqliteStore` in this process.
    pub limit: Step,
    /// Rows the limit marked published.
    pub marked: i64,
    /// The drained file's published rows purged in batches.
    pub purge: Step,
    /// Rows the purge deleted.
    pub purged: u64,
    /// The limit's published rows removed by one `DELETE`.
    pub delete: Step,
    /// Rows the `DELETE` removed.
    pub deleted: u64,
}

/// Events per second of `n` events in `step`.
pub(crate) fn rate(n: u64, step: &Step) -> f64 {
    n as f64 / step.time.as_secs_f64()
}

/// CPU microseconds per event.
pub(crate) fn cpu_per_event(n: u64, step: &Step) -> f64 {
    step.cpu_seconds * 1e6 / n.max(1) as f64
}

/// Runs the scenario on two SQLite files in `--out` and its own stream, all removed afterwards.
pub async fn run(bench: &Bench) -> Result<BacklogResult> {
    let scope = bench.scope("sqlite")?;
    let drained = bench.out_dir().join(format!("{}-drained.db", scope.stream));
    let claimed = bench.out_dir().join(format!("{}-claimed.db", scope.stream));
    let result = interruptible(async {
        bench.create_stream(&scope).await?;
        measure(bench, &scope, &drained, &claimed).await
    })
    .await;
    bench.cleanup(&scope).await;
    for path in [&drained, &claimed] {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
    result
}

async fn open(path: &Path, tables: &Tables) -> Result<SqlitePool> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    SqliteOutbox::new(tables.clone())
        .migrate(&pool, Default::default())
        .await?;
    Ok(pool)
}

/// Writes the backlog: `n` events over `--aggregates` aggregates, ~200-byte JSON payloads.
async fn insert(bench: &Bench, pool: &SqlitePool, tables: &Tables, n: u64) -> Result<Duration> {
    let outbox = SqliteOutbox::new(tables.clone());
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

async fn pending(pool: &SqlitePool, tables: &Tables) -> Result<i64> {
    let sql = tables.render_sqlite("SELECT count(*) FROM {events} WHERE status = 'pending'");
    Ok(sqlx::query_scalar(&sql).fetch_one(pool).await?)
}

fn own_cpu() -> f64 {
    process_cpu_seconds(std::process::id()).unwrap_or(0.0)
}

/// Measures `work` done in this process.
pub(crate) async fn in_process<T>(
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<(T, Step)> {
    let (cpu, machine, started) = (own_cpu(), MachineCpu::now(), Instant::now());
    let value = work.await?;
    let step = Step {
        time: started.elapsed(),
        cpu_seconds: own_cpu() - cpu,
        machine_cpu_percent: MachineCpu::now().busy_percent_since(&machine),
    };
    Ok((value, step))
}

async fn measure(
    bench: &Bench,
    scope: &Scope,
    drained: &Path,
    claimed: &Path,
) -> Result<BacklogResult> {
    let events = bench.options.events;
    let tables = &scope.tables;
    bench.log(
        scope.scenario,
        format!("writing {events} events to two files"),
    );
    let drained_pool = open(drained, tables).await?;
    let insert_time = insert(bench, &drained_pool, tables, events).await?;
    let claimed_pool = open(claimed, tables).await?;
    insert(bench, &claimed_pool, tables, events).await?;

    bench.log(scope.scenario, "draining with the relay");
    let url = format!("sqlite://{}", drained.display());
    let mut relay = RelayProcess::start_on(bench, scope, &url).await?;
    let machine = MachineCpu::now();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(bench.options.drain_timeout);
    while pending(&drained_pool, tables).await? > 0 {
        relay.check_alive()?;
        if Instant::now() > deadline {
            return Err("the relay did not drain the SQLite backlog in time".into());
        }
        tokio::time::sleep(POLL).await;
    }
    let drain = Step {
        time: started.elapsed(),
        cpu_seconds: relay.cpu_seconds(),
        machine_cpu_percent: MachineCpu::now().busy_percent_since(&machine),
    };
    let relay = relay.stop().await?;
    let stream_messages = bench.stream_messages(scope).await?;

    bench.log(
        scope.scenario,
        "claiming and marking with SqliteStore alone",
    );
    let store = SqliteStore::open(claimed_pool.clone(), tables).await?;
    let batch = bench.options.batch_size;
    let (marked, limit) = in_process(async {
        let relay_id = "bench-sqlite-limit";
        let fences = store.acquire(relay_id, 1, Duration::from_secs(600)).await?;
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
        "purging the drained file, deleting the other",
    );
    let admin = Admin::sqlite(drained_pool.clone(), tables);
    let (purged, purge) = in_process(async {
        Ok(admin
            .purge(Duration::ZERO, PURGE_BATCH, false, |_| {})
            .await?)
    })
    .await?;
    let delete_sql = tables.render_sqlite("DELETE FROM {events} WHERE status = 'published'");
    let (deleted, delete) = in_process(async {
        Ok(sqlx::query(&delete_sql)
            .execute(&claimed_pool)
            .await?
            .rows_affected())
    })
    .await?;
    drained_pool.close().await;
    claimed_pool.close().await;
    Ok(BacklogResult {
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
    })
}

/// The figures as markdown; `database` names the limit's database.
pub fn render(r: &BacklogResult, database: &str) -> String {
    let n = r.events;
    let row = |what: &str, done: u64, step: &Step, process: &str| {
        format!(
            "| {what} | {done} | {:.1} s | {:.0} | {:.1} s ({process}) | {:.1} | {:.0}% |\n",
            step.time.as_secs_f64(),
            rate(done, step),
            step.cpu_seconds,
            cpu_per_event(done, step),
            step.machine_cpu_percent,
        )
    };
    let mut out = String::from(
        "| step | events | time | events/s | CPU | CPU µs/event | machine CPU |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    out.push_str(&row("relay drain to JetStream", n, &r.drain, "relay"));
    out.push_str(&row(
        &format!("{database} alone: claim + mark"),
        r.marked as u64,
        &r.limit,
        "bench",
    ));
    out.push_str(&row("purge, batches of 1000", r.purged, &r.purge, "bench"));
    out.push_str(&row("one plain DELETE", r.deleted, &r.delete, "bench"));
    out.push_str(&format!(
        "\nRelay drain / {database}-alone limit: **{:.2}** of the limit's rate. Batched purge / one \
         DELETE: **{:.2}** of its rate. Backlog written in {:.1} s ({:.0} events/s, batches of \
         1000). Stream messages after the drain: {} of {n}. Relay peak RSS {:.1} MB, exit {}, \
         {} warnings, {} errors.\n",
        rate(n, &r.drain) / rate(r.marked as u64, &r.limit),
        rate(r.purged, &r.purge) / rate(r.deleted, &r.delete),
        r.insert_time.as_secs_f64(),
        n as f64 / r.insert_time.as_secs_f64(),
        r.stream_messages,
        r.relay.peak_rss_mb,
        r.relay.exit,
        r.relay.log.warnings,
        r.relay.log.errors,
    ));
    out
}

/// The SQLite library's version (sqlx bundles its own).
pub async fn version() -> Result<String> {
    let pool = SqlitePoolOptions::new().connect("sqlite::memory:").await?;
    Ok(sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&pool)
        .await?)
}
