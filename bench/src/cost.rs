//! The cost breakdown of a measured phase: CPU time per event of each process (the relay,
//! PostgreSQL with all its backends and helpers, the broker, the harness's own backends, the
//! whole machine), and what the database did per event: statements, rows, buffers and WAL per
//! statement (`pg_stat_statements`, when the server preloads it), rows written and index
//! entries read and added on the events table (the statistics views and index sizes).

use std::{collections::HashMap, fmt::Write, str::FromStr, time::Duration};

use sqlx::{postgres::PgConnectOptions, PgPool};

use crate::{
    common::{port_of, Result, Scope},
    context::{Bench, HARNESS_APPLICATION},
    process::{MachineCpu, CLOCK_TICKS},
    Broker,
};

/// The processes whose CPU a phase accounts for.
#[derive(Clone, Debug, Default)]
pub struct Processes {
    /// The relay child process, when the phase runs one.
    pub relay: Option<u32>,
    /// The postmaster of the database server (its backends are its children).
    pub postgres: Option<u32>,
    /// The broker process and its name, when it runs on this machine.
    pub broker: Option<(String, u32)>,
    /// PostgreSQL backends serving the harness's own polling (counted apart from the rest).
    pub harness_backends: Vec<u32>,
}

impl Processes {
    /// The database server listening on `database_port` and the broker on `broker_port`
    /// (named `broker_name`), found from the listening sockets of this machine.
    pub fn find(database_port: u16, broker: Option<(&str, u16)>) -> Self {
        Self {
            relay: None,
            postgres: listener_pid(database_port),
            broker: broker.and_then(|(name, port)| listener_pid(port).map(|p| (name.into(), p))),
            harness_backends: Vec::new(),
        }
    }
}

/// Cumulative CPU seconds of each process, at one instant.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSample {
    relay: f64,
    postgres: f64,
    broker: f64,
    harness: f64,
    machine: MachineCpu,
}

impl CpuSample {
    /// Reads every counter now.
    pub fn take(p: &Processes) -> Self {
        let harness: f64 = p
            .harness_backends
            .iter()
            .filter_map(|&pid| own_cpu(pid))
            .sum();
        Self {
            relay: p.relay.and_then(tree_cpu).unwrap_or(0.0),
            postgres: p.postgres.and_then(tree_cpu).unwrap_or(0.0) - harness,
            broker: p.broker.as_ref().and_then(|b| tree_cpu(b.1)).unwrap_or(0.0),
            harness,
            machine: MachineCpu::now(),
        }
    }
}

/// CPU per event of one phase.
#[derive(Clone, Debug, Default)]
pub struct Cpu {
    /// Events of the phase.
    pub events: u64,
    /// Wall time of the phase.
    pub wall: Duration,
    /// CPU seconds of the relay process (every thread).
    pub relay: Option<f64>,
    /// CPU seconds of PostgreSQL: the postmaster, its backends (exited ones included) and its
    /// helpers (WAL writer, checkpointer, …), less the harness's polling backends.
    pub postgres: Option<f64>,
    /// CPU seconds of the broker process, and its name.
    pub broker: Option<(String, f64)>,
    /// CPU seconds of the backends of the harness's progress polling.
    pub harness_backends: f64,
    /// CPU seconds of the harness process itself (the load generator of the phase, if any).
    pub harness: f64,
    /// Busy CPU seconds of the whole machine.
    pub machine: f64,
}

/// CPU seconds this process has used so far (every thread).
fn own_process_cpu() -> f64 {
    own_cpu(std::process::id()).unwrap_or(0.0)
}

/// A running CPU measurement: [`Meter::start`] then [`Meter::stop`].
pub struct Meter {
    processes: Processes,
    before: CpuSample,
    harness_before: f64,
    started: std::time::Instant,
}

impl Meter {
    /// Starts measuring `processes`.
    pub fn start(processes: Processes) -> Self {
        Self {
            before: CpuSample::take(&processes),
            harness_before: own_process_cpu(),
            processes,
            started: std::time::Instant::now(),
        }
    }

    /// Adds the relay process, counting its CPU from now (from zero for one just started).
    pub fn set_relay(&mut self, pid: u32) {
        self.processes.relay = Some(pid);
        self.before.relay = tree_cpu(pid).unwrap_or(0.0);
    }

    /// The CPU used since the start, for `events` events.
    pub fn stop(&self, events: u64) -> Cpu {
        let after = CpuSample::take(&self.processes);
        let machine_ticks = after.machine.busy_since(&self.before.machine);
        Cpu {
            events,
            wall: self.started.elapsed(),
            relay: self
                .processes
                .relay
                .map(|_| after.relay - self.before.relay),
            postgres: self
                .processes
                .postgres
                .map(|_| after.postgres - self.before.postgres),
            broker: self
                .processes
                .broker
                .as_ref()
                .map(|(name, _)| (name.clone(), after.broker - self.before.broker)),
            harness_backends: after.harness - self.before.harness,
            harness: own_process_cpu() - self.harness_before,
            machine: machine_ticks as f64 / CLOCK_TICKS,
        }
    }
}

impl Cpu {
    /// Microseconds per event of `seconds`.
    pub fn per_event(&self, seconds: f64) -> f64 {
        if self.events == 0 {
            return 0.0;
        }
        seconds * 1e6 / self.events as f64
    }

    /// Events per second.
    pub fn rate(&self) -> f64 {
        self.events as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// `utime + stime + cutime + cstime` of `pid` and of its live children, in seconds: a server's
/// whole CPU, the backends that already exited included (their time is added to the parent's
/// `cutime`/`cstime` when it reaps them).
fn tree_cpu(pid: u32) -> Option<f64> {
    let own = stat_fields(pid)?;
    let mut total = own.cpu_with_children();
    for child in children(pid) {
        if let Some(f) = stat_fields(child) {
            total += f.cpu_with_children();
        }
    }
    Some(total)
}

/// `utime + stime` of `pid` (every thread), in seconds.
fn own_cpu(pid: u32) -> Option<f64> {
    let f = stat_fields(pid)?;
    Some((f.utime + f.stime) as f64 / CLOCK_TICKS)
}

struct StatFields {
    ppid: u32,
    utime: u64,
    stime: u64,
    cutime: u64,
    cstime: u64,
}

impl StatFields {
    fn cpu_with_children(&self) -> f64 {
        (self.utime + self.stime + self.cutime + self.cstime) as f64 / CLOCK_TICKS
    }
}

fn stat_fields(pid: u32) -> Option<StatFields> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) start with the state.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(StatFields {
        ppid: n(1)? as u32,
        utime: n(11)?,
        stime: n(12)?,
        cutime: n(13)?,
        cstime: n(14)?,
    })
}

/// The live processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| stat_fields(p).is_some_and(|f| f.ppid == pid))
        .collect()
}

/// The process listening on TCP `port` (IPv4 or IPv6, any address), from `/proc/net/tcp*`
/// and the processes' socket descriptors.
pub fn listener_pid(port: u16) -> Option<u32> {
    let wanted = format!(":{port:04X}");
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address rem_address st … inode; state 0A is LISTEN.
            if f.len() > 9 && f[1].ends_with(&wanted) && f[3] == "0A" {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let listens = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
        });
        if listens {
            found.push(pid);
        }
    }
    // A forking server shares the socket with its children: the parent is the server.
    found
        .iter()
        .copied()
        .find(|&p| stat_fields(p).is_none_or(|f| !found.contains(&f.ppid)))
}

/// What one statement cost over a phase (`pg_stat_statements`).
#[derive(Clone, Debug)]
pub struct StatementCost {
    /// A short name: the relay's statement it is, or the start of its text.
    pub label: String,
    /// Times it ran.
    pub calls: i64,
    /// Rows it returned or changed.
    pub rows: i64,
    /// Execution time, ms.
    pub exec_ms: f64,
    /// Shared buffers hit and read.
    pub blocks: i64,
    /// WAL bytes it wrote.
    pub wal_bytes: i64,
}

/// What the database did over a phase.
#[derive(Clone, Debug, Default)]
pub struct DbWork {
    /// Per statement, most expensive first; empty when `pg_stat_statements` is not loaded.
    pub statements: Vec<StatementCost>,
    /// Whether `pg_stat_statements` was available.
    pub statements_tracked: bool,
    /// Transactions committed in the database.
    pub commits: i64,
    /// WAL written by the whole server, bytes.
    pub wal_bytes: i64,
    /// Rows of the events table inserted, updated (of which HOT), deleted.
    pub inserted: i64,
    /// Rows updated.
    pub updated: i64,
    /// Of the updates, those that added no index entry (heap-only tuples).
    pub hot_updated: i64,
    /// Rows deleted.
    pub deleted: i64,
    /// Index scans and entries read, per index of the events table: (index, scans, entries).
    pub index_reads: Vec<(String, i64, i64)>,
    /// Growth of each index of the events table over the phase, bytes: (index, bytes).
    pub index_growth: Vec<(String, i64)>,
}

/// Counters of the database at one instant, to diff at the end of a phase.
pub struct DbCounters {
    wal_lsn: String,
    commits: i64,
    table: (i64, i64, i64, i64),
    indexes: HashMap<String, (i64, i64, i64)>,
    tracked: bool,
}

impl DbCounters {
    /// Reads the counters of `scope`'s events table (and resets `pg_stat_statements`).
    pub async fn take(pool: &PgPool, scope: &Scope) -> Result<Self> {
        clear_snapshot(pool).await;
        let tracked = sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(pool)
            .await
            .is_ok();
        Self::read(pool, scope, tracked).await
    }

    async fn read(pool: &PgPool, scope: &Scope, tracked: bool) -> Result<Self> {
        let (wal_lsn, commits): (String, i64) = sqlx::query_as(
            "SELECT pg_current_wal_lsn()::text, xact_commit FROM pg_stat_database
             WHERE datname = current_database()",
        )
        .fetch_one(pool)
        .await?;
        let schema = scope.tables.schema().as_str();
        let table = scope.tables.events().as_str();
        let counts: Option<(i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables
             WHERE schemaname = $1 AND relname = $2",
        )
        .bind(schema)
        .bind(table)
        .fetch_optional(pool)
        .await?;
        let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT s.indexrelname::text, s.idx_scan, s.idx_tup_read,
                    pg_relation_size(s.indexrelid)
             FROM pg_stat_user_indexes s WHERE s.schemaname = $1 AND s.relname = $2",
        )
        .bind(schema)
        .bind(table)
        .fetch_all(pool)
        .await?;
        Ok(Self {
            wal_lsn,
            commits,
            table: counts.unwrap_or_default(),
            indexes: rows
                .into_iter()
                .map(|(n, scans, read, size)| (n, (scans, read, size)))
                .collect(),
            tracked,
        })
    }

    /// What happened since these counters were read.
    pub async fn since(&self, pool: &PgPool, scope: &Scope) -> Result<DbWork> {
        // Statistics of backends reach the shared counters shortly after each transaction.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        clear_snapshot(pool).await;
        let now = Self::read(pool, scope, self.tracked).await?;
        let wal_bytes: f64 =
            sqlx::query_scalar("SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8")
                .bind(&now.wal_lsn)
                .bind(&self.wal_lsn)
                .fetch_one(pool)
                .await?;
        let mut index_reads = Vec::new();
        let mut index_growth = Vec::new();
        for (name, (scans, read, size)) in &now.indexes {
            let (s0, r0, z0) = self.indexes.get(name).copied().unwrap_or_default();
            if read - r0 > 0 || scans - s0 > 0 {
                index_reads.push((name.clone(), scans - s0, read - r0));
            }
            index_growth.push((name.clone(), size - z0));
        }
        index_reads.sort_by_key(|r| std::cmp::Reverse(r.2));
        index_growth.sort();
        let statements = if self.tracked {
            statements(pool).await.unwrap_or_default()
        } else {
            Vec::new()
        };
        Ok(DbWork {
            statements,
            statements_tracked: self.tracked,
            commits: now.commits - self.commits,
            wal_bytes: wal_bytes as i64,
            inserted: now.table.0 - self.table.0,
            updated: now.table.1 - self.table.1,
            hot_updated: now.table.2 - self.table.2,
            deleted: now.table.3 - self.table.3,
            index_reads,
            index_growth,
        })
    }
}

async fn clear_snapshot(pool: &PgPool) {
    let _ = sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(pool)
        .await;
}

/// Every statement `pg_stat_statements` saw since its reset, most expensive first, without the
/// harness's own reads of the statistics.
async fn statements(pool: &PgPool) -> Result<Vec<StatementCost>> {
    let rows: Vec<(String, i64, i64, f64, i64, i64)> = sqlx::query_as(
        "SELECT query, calls, rows, total_exec_time,
                (shared_blks_hit + shared_blks_read)::bigint, wal_bytes::bigint
         FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database
                                               WHERE datname = current_database())
         ORDER BY total_exec_time DESC",
    )
    .fetch_all(pool)
    .await?;
    let mut merged: Vec<StatementCost> = Vec::new();
    for (query, calls, rows, exec_ms, blocks, wal_bytes) in rows {
        let label = label(&query);
        if label.starts_with("(harness)") {
            continue;
        }
        match merged.iter_mut().find(|s| s.label == label) {
            Some(s) => {
                s.calls += calls;
                s.rows += rows;
                s.exec_ms += exec_ms;
                s.blocks += blocks;
                s.wal_bytes += wal_bytes;
            }
            None => merged.push(StatementCost {
                label,
                calls,
                rows,
                exec_ms,
                blocks,
                wal_bytes,
            }),
        }
    }
    merged.sort_by(|a, b| b.exec_ms.total_cmp(&a.exec_ms));
    Ok(merged)
}

/// A short name for a statement: the relay's statement it is, else its first words.
fn label(query: &str) -> String {
    const KNOWN: &[(&str, &str)] = &[
        ("outbox-bench: sql-only", "SQL-only claim + mark"),
        ("pg_stat_statements", "(harness) statistics"),
        ("pg_stat_user_", "(harness) statistics"),
        ("pg_stat_database", "(harness) statistics"),
        ("pg_stat_clear_snapshot", "(harness) statistics"),
        ("pg_wal_lsn_diff", "(harness) statistics"),
        ("WITH scanned AS", "relay: claim"),
        // pg_stat_statements shows constants as $n: match on what has none.
        ("published_at = now()", "relay: mark published"),
        ("AS f(id, error, backoff", "relay: mark failed"),
        ("AS pending,", "relay: backlog sample"),
        ("WITH RECURSIVE waiting", "relay: waiting-row repair"),
        ("n_mod_since_analyze", "relay: statistics check"),
        ("ANALYZE", "relay: ANALYZE"),
        ("INTO {schema}.relays", "relay: heartbeat"),
        (".relays", "relay: heartbeat"),
        (".leases", "relay: leases"),
        ("LISTEN", "relay: LISTEN"),
    ];
    let text: String = query
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ");
    if let Some((_, name)) = KNOWN.iter().find(|(needle, _)| text.contains(needle)) {
        return (*name).to_owned();
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut short = words.join(" ");
    if short.len() > 60 {
        let mut end = 60;
        while !short.is_char_boundary(end) {
            end -= 1;
        }
        short.truncate(end);
        short.push('…');
    }
    short
}

/// One row of the breakdown table: a phase's name, its CPU and database work.
pub struct Phase<'a> {
    /// What ran (e.g. "(a) drain to NATS").
    pub name: String,
    /// Its CPU.
    pub cpu: &'a Cpu,
    /// Its database work, if measured.
    pub db: Option<&'a DbWork>,
}

/// The breakdown table of `phases` (markdown), then each phase's statements.
pub fn render(phases: &[Phase<'_>]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| phase | events | events/s | relay µs/event | PostgreSQL µs/event | broker µs/event \
         | harness µs/event | machine µs/event | statements/event | WAL bytes/event | rows \
         written/event | index bytes added/event |"
    );
    let _ = writeln!(
        out,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let dash = || "–".to_owned();
    for p in phases {
        let c = p.cpu;
        let us = |s: Option<f64>| s.map_or_else(dash, |s| format!("{:.1}", c.per_event(s)));
        let per = |n: i64| format!("{:.2}", n as f64 / c.events.max(1) as f64);
        let (statements, wal, rows, index) = match p.db {
            Some(d) => (
                if d.statements_tracked {
                    per(d.statements.iter().map(|s| s.calls).sum())
                } else {
                    format!("{} commits", per(d.commits))
                },
                format!("{:.0}", d.wal_bytes as f64 / c.events.max(1) as f64),
                per(d.inserted + d.updated + d.deleted),
                format!(
                    "{:.1}",
                    d.index_growth.iter().map(|g| g.1.max(0)).sum::<i64>() as f64
                        / c.events.max(1) as f64
                ),
            ),
            None => (dash(), dash(), dash(), dash()),
        };
        let broker = c
            .broker
            .as_ref()
            .map_or_else(dash, |(n, s)| format!("{:.1} ({n})", c.per_event(*s)));
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} |",
            p.name,
            c.events,
            c.rate(),
            us(c.relay),
            us(c.postgres),
            broker,
            c.per_event(c.harness + c.harness_backends),
            c.per_event(c.machine),
            statements,
            wal,
            rows,
            index,
        );
    }
    for p in phases {
        let Some(d) = p.db else { continue };
        let events = p.cpu.events.max(1) as f64;
        let _ = writeln!(out, "\n**{}**: ", p.name);
        let _ = writeln!(
            out,
            "events table: {:.2} inserts, {:.2} updates ({:.2} HOT), {:.2} deletes per event; \
             index entries read per event: {}; index growth per event: {}.",
            d.inserted as f64 / events,
            d.updated as f64 / events,
            d.hot_updated as f64 / events,
            d.deleted as f64 / events,
            join(d.index_reads.iter().map(|(n, _, r)| format!(
                "{} {:.2}",
                short_index(n),
                *r as f64 / events
            ))),
            join(
                d.index_growth
                    .iter()
                    .filter(|g| g.1 > 0)
                    .map(|(n, b)| format!("{} {:.1} B", short_index(n), *b as f64 / events))
            ),
        );
        if !d.statements_tracked {
            let _ = writeln!(
                out,
                "\n(`pg_stat_statements` is not loaded on this server: no per-statement \
                 figures; `bash bench/postgres.sh start` starts one that has it.)"
            );
            continue;
        }
        let _ = writeln!(
            out,
            "\n| statement | calls | per event | rows/call | exec µs/event | buffers/event | WAL \
             bytes/event |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for s in d.statements.iter().take(12) {
            let _ = writeln!(
                out,
                "| {} | {} | {:.4} | {:.1} | {:.2} | {:.2} | {:.0} |",
                s.label.replace('|', "\\|"),
                s.calls,
                s.calls as f64 / events,
                s.rows as f64 / s.calls.max(1) as f64,
                s.exec_ms * 1000.0 / events,
                s.blocks as f64 / events,
                s.wal_bytes as f64 / events,
            );
        }
    }
    out
}

/// An index name without the schema-specific prefix (`bench_drain_…_events_claimable` →
/// `claimable`).
fn short_index(name: &str) -> &str {
    name.rsplit_once("events_").map_or(name, |(_, s)| s)
}

fn join(parts: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = parts.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

impl Bench {
    /// The processes a phase of `scope` accounts for: the database server and the broker the
    /// scenario publishes to (found by their listening ports), and the harness's own backends
    /// (its pool is opened in full first, so that every one of them is known).
    pub async fn processes(&self, scope: &Scope) -> Result<Processes> {
        let database_port = PgConnectOptions::from_str(&self.options.database_url)?.get_port();
        let broker = match self.broker_of(scope) {
            Broker::Nats => ("nats-server", port_of(&self.options.nats_url, 4222)),
            Broker::Kafka => ("kafka", port_of(&self.options.kafka_brokers, 9092)),
            Broker::Rabbitmq => ("rabbitmq", port_of(&self.options.rabbitmq_url, 5672)),
        };
        let mut processes = Processes::find(database_port, Some(broker));
        let mut held = Vec::new();
        for _ in 0..self.pool.options().get_max_connections() {
            held.push(self.pool.acquire().await?);
        }
        drop(held);
        let pids: Vec<i32> =
            sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
                .bind(HARNESS_APPLICATION)
                .fetch_all(&self.pool)
                .await?;
        processes.harness_backends = pids.into_iter().map(|p| p as u32).collect();
        Ok(processes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_the_relays_statements() {
        assert_eq!(
            label("-- comment\nWITH scanned AS MATERIALIZED (\n SELECT 1"),
            "relay: claim"
        );
        assert_eq!(
            label("SELECT count(*) FROM pg_stat_statements"),
            "(harness) statistics"
        );
        let long = label(&"SELECT x, ".repeat(20));
        assert!(long.ends_with('…') && long.chars().count() <= 61, "{long}");
    }

    #[test]
    fn finds_nothing_on_a_closed_port() {
        assert_eq!(listener_pid(1), None);
    }

    #[test]
    fn own_process_has_cpu_and_a_tree() {
        assert!(own_cpu(std::process::id()).is_some());
        assert!(tree_cpu(std::process::id()).is_some());
    }
}
