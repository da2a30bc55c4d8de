//! The results table (markdown), printed and written to `bench/out/results.md`.

use std::{fmt::Write, time::Duration};

use crate::{
    cost::Phase,
    dbbound::DbBoundResult,
    drain::DrainResult,
    machine::Machine,
    naive::NaiveResult,
    natsonly::NatsOnlyResult,
    process::RelayStats,
    progress::Progress,
    sqlonly::SqlOnlyResult,
    steady::{FixedRate, SteadyResult},
};

/// The figures of one run; scenarios not run (or failed) are `None`.
pub struct Report {
    machine: Machine,
    command: String,
    started: chrono::DateTime<chrono::Utc>,
    /// (a) drain.
    pub drain: Option<DrainResult>,
    /// (b) dbbound.
    pub dbbound: Option<DbBoundResult>,
    /// (j) sqlonly.
    pub sqlonly: Option<SqlOnlyResult>,
    /// (k) natsonly.
    pub natsonly: Option<NatsOnlyResult>,
    /// (c) naive.
    pub naive: Option<NaiveResult>,
    /// (d) steady.
    pub steady: Option<SteadyResult>,
}

impl Report {
    /// An empty report.
    pub fn new(machine: Machine, command: String) -> Self {
        Self {
            machine,
            command,
            started: chrono::Utc::now(),
            drain: None,
            dbbound: None,
            sqlonly: None,
            natsonly: None,
            naive: None,
            steady: None,
        }
    }

    /// The markdown text: machine facts, the table, then notes on the relay logs.
    pub fn render(&self) -> String {
        let m = &self.machine;
        let mut out = String::new();
        let _ = writeln!(out, "# outbox benchmark results\n");
        let _ = writeln!(
            out,
            "Run {} UTC: `{}`.\n",
            self.started.format("%Y-%m-%d %H:%M:%S"),
            self.command
        );
        let _ = writeln!(
            out,
            "Machine: nproc {} ({}), {:.1} GiB RAM, load average {} at the start and {} at the \
             end; PostgreSQL {} (shared_buffers {}, synchronous_commit {}, autovacuum {}); {}. \
             All on loopback: the relay, PostgreSQL, the broker and the harness share the \
             CPUs.\n",
            m.nproc,
            m.cpu_model,
            m.memory_gib,
            m.load_average,
            crate::machine::load_average(),
            m.postgres,
            m.shared_buffers,
            m.synchronous_commit,
            m.autovacuum,
            m.brokers
        );
        let mut rows = Vec::new();
        let mut notes = Vec::new();
        if let Some(r) = &self.drain {
            drain_rows(r, &mut rows);
            log_notes("(a) drain", &r.relay, &mut notes);
        }
        if let Some(r) = &self.dbbound {
            dbbound_rows(r, &mut rows);
        }
        if let (Some(a), Some(b)) = (&self.drain, &self.dbbound) {
            rows.push(row(
                "(a)/(b)",
                "relay drain ÷ PostgreSQL alone",
                format!("**{:.2}**", a.rate() / b.rate()),
            ));
        }
        if let Some(r) = &self.sqlonly {
            rows.push(row(
                "(j) sqlonly",
                "the bare claim + mark statement, one client, no broker",
                format!(
                    "**{} events/s** ({} statements)",
                    thousands(r.rate() as u64),
                    thousands(r.statements)
                ),
            ));
            if let Some(a) = &self.drain {
                rows.push(row(
                    "(a)/(j)",
                    "relay drain ÷ the bare statement",
                    format!("**{:.2}**", a.rate() / r.rate()),
                ));
            }
        }
        if let Some(r) = &self.natsonly {
            rows.push(row(
                "(k) natsonly",
                "async-nats alone: JetStream publishes with the relay's headers, no database",
                format!(
                    "**{} messages/s**, {:.1} µs of client CPU per message ({} outstanding)",
                    thousands(r.cpu.rate() as u64),
                    r.cpu.per_event(r.cpu.harness),
                    r.window
                ),
            ));
        }
        if let Some(r) = &self.naive {
            naive_rows(r, &mut rows);
            if let Some(a) = &self.drain {
                rows.push(row(
                    "(a)/(c)",
                    "relay drain ÷ naive loop",
                    format!("{:.0}×", a.rate() / r.rate()),
                ));
            }
        }
        if let Some(r) = &self.steady {
            steady_rows(r, &mut rows);
            log_notes("(d) steady", &r.relay, &mut notes);
        }
        let _ = writeln!(out, "| Scenario | Measure | Result |");
        let _ = writeln!(out, "|---|---|---|");
        for [scenario, measure, result] in rows {
            let _ = writeln!(out, "| {scenario} | {measure} | {result} |");
        }
        let phases = self.cost_phases();
        if !phases.is_empty() {
            let _ = writeln!(out, "\n## Cost per event\n");
            let _ = writeln!(
                out,
                "CPU time (user + system) of each process over the phase, per event: the relay \
                 (every thread), PostgreSQL (postmaster, backends and helpers, less the \
                 harness's polling backends), the broker, the harness (its process and its \
                 polling backends) and the whole machine. Statements, WAL, rows and index \
                 growth are the database's over the phase (`pg_stat_statements`, \
                 `pg_stat_user_tables`, index sizes).\n"
            );
            let _ = writeln!(out, "{}", crate::cost::render(&phases));
        }
        if !notes.is_empty() {
            let _ = writeln!(out, "\n## Relay logs\n");
            for note in notes {
                let _ = writeln!(out, "- {note}");
            }
        }
        out
    }
}

impl Report {
    /// The phases with a cost breakdown, in the order they ran.
    fn cost_phases(&self) -> Vec<Phase<'_>> {
        let mut phases = Vec::new();
        if let Some(r) = &self.drain {
            phases.push(Phase {
                name: "(a) drain".into(),
                cpu: &r.cpu,
                db: Some(&r.db),
            });
        }
        if let Some(r) = &self.dbbound {
            phases.push(Phase {
                name: format!("(b) dbbound, {} workers", r.workers),
                cpu: &r.cpu,
                db: Some(&r.db),
            });
        }
        if let Some(r) = &self.sqlonly {
            phases.push(Phase {
                name: "(j) sqlonly, one client".into(),
                cpu: &r.cpu,
                db: Some(&r.db),
            });
        }
        if let Some(r) = &self.natsonly {
            phases.push(Phase {
                name: "(k) natsonly: the client alone (harness = async-nats)".into(),
                cpu: &r.cpu,
                db: None,
            });
        }
        if let Some(r) = &self.steady {
            for p in &r.phases {
                phases.push(Phase {
                    name: format!(
                        "(d) steady, writers and relay, NOTIFY {}",
                        if p.notify { "on" } else { "off" }
                    ),
                    cpu: &p.cpu,
                    db: Some(&p.db),
                });
            }
        }
        phases
    }
}

type Row = [String; 3];

fn row(scenario: &str, measure: &str, result: String) -> Row {
    [scenario.to_owned(), measure.to_owned(), result]
}

fn drain_rows(r: &DrainResult, rows: &mut Vec<Row>) {
    let s = "(a) drain";
    rows.push(row(
        s,
        "backlog",
        format!(
            "{} events, {:.0}-byte JSON payloads (inserted in {})",
            thousands(r.events),
            r.payload_bytes,
            secs(r.insert_time)
        ),
    ));
    rows.push(row(
        s,
        "time to drain (relay start → 0 pending)",
        secs(r.drain_time),
    ));
    rows.push(row(
        s,
        "throughput",
        format!("**{} events/s**", thousands(r.rate() as u64)),
    ));
    progress_row(s, &r.progress, r.drain_time, rows);
    index_row(s, &r.index_reads, r.events, rows);
    rows.push(row(
        s,
        "ANALYZE runs during the drain (relay's statistics refresh)",
        r.analyzed.to_string(),
    ));
    rss_row(s, &r.relay, rows);
    rows.push(row(
        s,
        "CPU during the drain",
        format!(
            "relay {:.0}% of one core; whole machine {:.0}% busy",
            r.relay_cpu_percent, r.machine_cpu_percent
        ),
    ));
    let check = if r.stream_messages >= r.events {
        "ok"
    } else {
        "**FAILED**"
    };
    rows.push(row(
        s,
        "stream (or topic) holds ≥ N messages",
        format!("{check}: {}", thousands(r.stream_messages)),
    ));
}

fn dbbound_rows(r: &DbBoundResult, rows: &mut Vec<Row>) {
    let s = "(b) dbbound";
    rows.push(row(
        s,
        "claim + mark, no broker",
        format!(
            "{} of {} events in {} ({} workers over disjoint partitions)",
            thousands(r.marked as u64),
            thousands(r.events),
            secs(r.time),
            r.workers
        ),
    ));
    rows.push(row(
        s,
        "throughput",
        format!("**{} events/s**", thousands(r.rate() as u64)),
    ));
    progress_row(s, &r.progress, r.time, rows);
    index_row(s, &r.index_reads, r.events, rows);
    rows.push(row(
        s,
        "ANALYZE runs during the run (as the relay refreshes statistics)",
        r.analyzed.to_string(),
    ));
    rows.push(row(
        s,
        "CPU",
        format!("whole machine {:.0}% busy", r.machine_cpu_percent),
    ));
}

fn naive_rows(r: &NaiveResult, rows: &mut Vec<Row>) {
    let s = "(c) naive";
    rows.push(row(
        s,
        "throughput (50 rows, 1 UPDATE each, sleep 2 s)",
        format!(
            "**{:.1} events/s** ({} events in {})",
            r.rate(),
            r.published,
            secs(r.elapsed)
        ),
    ));
    let projected = r.projected_1m();
    rows.push(row(
        s,
        "projected time to drain 1,000,000",
        format!(
            "{:.1} h ({:.1} days)",
            projected.as_secs_f64() / 3600.0,
            projected.as_secs_f64() / 86400.0
        ),
    ));
}

fn steady_rows(r: &SteadyResult, rows: &mut Vec<Row>) {
    let s = "(d) steady";
    let on = r.max_notify.per_second();
    let off = r.max_silent.per_second();
    rows.push(row(
        s,
        &format!("writers' max rate, NOTIFY on ({} writers)", r.writers),
        format!("**{} commits/s**", thousands(on as u64)),
    ));
    rows.push(row(
        s,
        "writers' max rate, `.notify(false)`",
        format!(
            "**{} commits/s** ({:+.0}% vs NOTIFY on)",
            thousands(off as u64),
            100.0 * (off / on - 1.0)
        ),
    ));
    for phase in &r.phases {
        phase_rows(r, phase, rows);
    }
    rss_row(s, &r.relay, rows);
}

fn phase_rows(r: &SteadyResult, p: &FixedRate, rows: &mut Vec<Row>) {
    let s = if p.notify {
        "(d) steady, NOTIFY on"
    } else {
        "(d) steady, NOTIFY off"
    };
    rows.push(row(
        s,
        "fixed write rate with the relay running",
        format!(
            "target {} events/s; achieved {} events/s ({} events in {}); writers' transactions \
             p50 / p99 {:.1} / {:.1} ms",
            thousands(r.target_rate as u64),
            thousands(p.written.per_second() as u64),
            thousands(p.written.commits),
            secs(p.written.elapsed),
            quantile(&p.written.transaction_ms, 0.5),
            quantile(&p.written.transaction_ms, 0.99),
        ),
    ));
    let ms = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.1}"));
    rows.push(row(
        s,
        "commit (answered to the writer) to delivery, after the first second, p50 / p99 / \
         p99.9 / max",
        format!(
            "**{} / {} / {} / {} ms**",
            ms(p.commit_latency(0.5)),
            ms(p.commit_latency(0.99)),
            ms(p.commit_latency(0.999)),
            ms(p.commit_latency(1.0))
        ),
    ));
    rows.push(row(
        s,
        "occurred-at (insert, before the commit) to delivery, p50 / p99 / p99.9 / max",
        format!(
            "{} / {} / {} / {} ms",
            ms(p.latency(0.5)),
            ms(p.latency(0.99)),
            ms(p.latency(0.999)),
            ms(p.latency(1.0))
        ),
    ));
    let slow = p.latencies_ms.iter().filter(|&&l| l >= 1000.0).count();
    rows.push(row(
        s,
        "events delivered 1 s or more after their insert; over 100 ms (when they arrived)",
        format!(
            "{slow} ({:.2}%); {} ({:.1}–{:.1} s into the phase)",
            100.0 * slow as f64 / p.latencies_ms.len().max(1) as f64,
            p.slow.0,
            p.slow.1,
            p.slow.2
        ),
    ));
    rows.push(row(
        s,
        "messages received",
        format!(
            "{} of {} events ({} duplicates)",
            thousands(p.received as u64),
            thousands(p.written.commits),
            p.duplicates
        ),
    ));
    let drained = p.drain_after.map_or("not within 30 s".to_owned(), |d| {
        format!("{:.2} s", d.as_secs_f64())
    });
    rows.push(row(
        s,
        "relay kept up",
        format!(
            "**{}**: pending {} at the end of writing (limit {:.0}), max {} while writing; \
             0 pending {} later",
            if p.kept_up(r.target_rate) {
                "yes"
            } else {
                "no"
            },
            p.pending_at_end,
            p.pending_limit(r.target_rate),
            p.max_pending,
            drained
        ),
    ));
    rows.push(row(
        s,
        "relay CPU while writing",
        format!("{:.0}% of one core", p.relay_cpu_percent),
    ));
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn progress_row(scenario: &str, progress: &Progress, end: Duration, rows: &mut Vec<Row>) {
    let rate = |r: Option<f64>| r.map_or("n/a".to_owned(), |r| thousands(r as u64));
    rows.push(row(
        scenario,
        "throughput over the first / last quarter of the backlog",
        format!(
            "{} / {} events/s",
            rate(progress.early_rate()),
            rate(progress.late_rate(end))
        ),
    ));
    let (polls, busy) = progress.polls();
    rows.push(row(
        scenario,
        "harness's pending-count polls (measurement load)",
        format!(
            "{polls} polls, {:.0} ms each on average: a backend busy {:.0}% of the time",
            busy.as_secs_f64() * 1000.0 / f64::from(polls.max(1)),
            100.0 * busy.as_secs_f64() / end.as_secs_f64().max(f64::MIN_POSITIVE)
        ),
    ));
}

fn index_row(scenario: &str, reads: &[(String, i64, i64)], events: u64, rows: &mut Vec<Row>) {
    let text: Vec<String> = reads
        .iter()
        .map(|(index, scans, entries)| {
            format!(
                "{index} {} in {} scans ({:.1} per event)",
                thousands(*entries as u64),
                thousands(*scans as u64),
                *entries as f64 / events.max(1) as f64
            )
        })
        .collect();
    rows.push(row(
        scenario,
        "index entries read (pg_stat_user_indexes)",
        if text.is_empty() {
            "n/a".to_owned()
        } else {
            text.join("; ")
        },
    ));
}

fn rss_row(scenario: &str, relay: &RelayStats, rows: &mut Vec<Row>) {
    rows.push(row(
        scenario,
        "relay peak RSS",
        format!(
            "**{:.1} MB** (VmRSS every 250 ms; VmHWM {:.1} MB)",
            relay.peak_rss_mb, relay.hwm_mb
        ),
    ));
}

fn log_notes(scenario: &str, relay: &RelayStats, notes: &mut Vec<String>) {
    let log = &relay.log;
    notes.push(format!(
        "{scenario}: `{}`: {} WARN, {} ERROR lines; exit after SIGTERM: {}.",
        log.path.display(),
        log.warnings,
        log.errors,
        relay.exit
    ));
    for (sample, count) in &log.samples {
        notes.push(format!("{scenario}: {count}× `{sample}`"));
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_thousands() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
