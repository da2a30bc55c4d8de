//! The verdict: what was committed (the outbox table after the run, cross-checked with the
//! writers' ledger and the business table) against what the stream holds.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    time::{Duration, SystemTime},
};

use outbox_testkit::{Delivery, Report};
use uuid::Uuid;

use super::{
    consumer::Record,
    monkey::Counts,
    writer::{Fate, Written},
};

/// A row of the outbox table after the run.
#[derive(Clone, Debug)]
pub struct Row {
    /// `event_id`.
    pub event_id: Uuid,
    /// `aggregate_id`.
    pub aggregate_id: String,
    /// `aggregate_version`.
    pub version: i64,
    /// `status`.
    pub status: String,
}

/// Every figure of a run.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// Events committed (rows in the outbox table).
    pub committed: usize,
    /// Events whose transaction rolled back on purpose.
    pub rolled_back: usize,
    /// Events whose transaction failed before COMMIT (a database crash).
    pub aborted: usize,
    /// Events whose COMMIT lost its answer, and how many of them the table holds.
    pub interrupted: (usize, usize),
    /// Messages the stream holds.
    pub messages: usize,
    /// Distinct events in the stream.
    pub delivered: usize,
    /// Extra copies in the stream.
    pub duplicated: usize,
    /// Committed events the stream does not hold (G1), with their aggregate, version and
    /// outbox status.
    pub lost: Vec<String>,
    /// Events in the stream that were never committed (G2), and how many of them were rolled
    /// back on purpose.
    pub phantoms: (Vec<String>, usize),
    /// First deliveries that came after the first delivery of a later version of the same
    /// aggregate (G4).
    pub order_violations: usize,
    /// Commit to broker (NATS: stream timestamp) or to consumer (RabbitMQ: receive time),
    /// over the events whose commit time is known: median, 99th percentile, worst.
    pub lag: (Duration, Duration, Duration),
    /// "broker" or "consumer": where the lag ends.
    pub lag_to: &'static str,
    /// Rows not `published` at the end (pending or dead).
    pub unpublished: usize,
    /// Writer-committed events missing from the table, or table rows the writers rolled back.
    pub ledger_mismatches: Vec<String>,
    /// Aggregates whose business version differs from their committed events.
    pub business_mismatches: Vec<String>,
    /// Faults injected.
    pub faults: Counts,
    /// Relay processes that exited by themselves (and were restarted by the supervisor).
    pub relay_exits: usize,
    /// Times the independent consumer had to resume (broker restarts).
    pub consumer_resumes: u64,
    /// The purges run beside the relays (none unless the run purges).
    pub purges: super::purger::Purges,
}

/// The committed events of a run whose events leave no row (zero-growth and table-less
/// writes), from the writers' ledger and the business table: an event committed when its
/// COMMIT answered OK, or, when that answer was lost, when its aggregate reached its version
/// and no other event committed that version (a transaction that did not commit leaves the
/// version to the next one). `rows` are the rows the table holds all the same (events the
/// relay wrote back: retries, dead letters), whose status counts.
pub fn committed_from_ledger(
    ledger: &[Written],
    business: &[(String, i64)],
    rows: &[Row],
) -> Vec<Row> {
    let reached: HashMap<&str, i64> = business.iter().map(|(a, v)| (a.as_str(), *v)).collect();
    let confirmed: HashSet<(&str, i64)> = ledger
        .iter()
        .filter(|w| matches!(w.fate, Fate::Committed(_)))
        .map(|w| (w.aggregate_id.as_str(), w.version))
        .collect();
    let status: HashMap<Uuid, &str> = rows
        .iter()
        .map(|r| (r.event_id, r.status.as_str()))
        .collect();
    ledger
        .iter()
        .filter(|w| match w.fate {
            Fate::Committed(_) => true,
            Fate::Interrupted => {
                reached
                    .get(w.aggregate_id.as_str())
                    .is_some_and(|v| w.version <= *v)
                    && !confirmed.contains(&(w.aggregate_id.as_str(), w.version))
            }
            Fate::RolledBack | Fate::Aborted => false,
        })
        .map(|w| Row {
            event_id: w.event_id,
            aggregate_id: w.aggregate_id.clone(),
            version: w.version,
            status: status.get(&w.event_id).unwrap_or(&"published").to_string(),
        })
        .collect()
}

/// Counts everything. `business` is the final `(id, version)` of every aggregate.
pub fn tally(
    ledger: &[Written],
    table: &[Row],
    business: &[(String, i64)],
    records: &[Record],
) -> Figures {
    let mut f = Figures::default();
    let committed: HashMap<Uuid, &Row> = table.iter().map(|r| (r.event_id, r)).collect();
    f.committed = committed.len();
    f.unpublished = table.iter().filter(|r| r.status != "published").count();
    let by_id: HashMap<Uuid, &Written> = ledger.iter().map(|w| (w.event_id, w)).collect();
    for w in ledger {
        let in_table = committed.contains_key(&w.event_id);
        match w.fate {
            Fate::Committed(_) if !in_table => f.ledger_mismatches.push(format!(
                "{} ({} v{}) committed but not in the table",
                w.event_id, w.aggregate_id, w.version
            )),
            Fate::RolledBack | Fate::Aborted if in_table => f.ledger_mismatches.push(format!(
                "{} ({} v{}) in the table but its transaction failed: {:?}",
                w.event_id, w.aggregate_id, w.version, w.fate
            )),
            _ => {}
        }
        match w.fate {
            Fate::RolledBack => f.rolled_back += 1,
            Fate::Aborted => f.aborted += 1,
            Fate::Interrupted => {
                f.interrupted.0 += 1;
                f.interrupted.1 += usize::from(in_table);
            }
            Fate::Committed(_) => {}
        }
    }
    for r in table {
        if !by_id.contains_key(&r.event_id) {
            f.ledger_mismatches
                .push(format!("{} in the table but never written", r.event_id));
        }
    }

    // Business rows: each aggregate's version is the number of its committed events, and
    // those are versions 1..=n.
    let mut versions: HashMap<&str, Vec<i64>> = HashMap::new();
    for r in table {
        versions.entry(&r.aggregate_id).or_default().push(r.version);
    }
    for (id, version) in business {
        let mut got = versions.remove(id.as_str()).unwrap_or_default();
        got.sort_unstable();
        if got != (1..=*version).collect::<Vec<_>>() {
            f.business_mismatches.push(format!(
                "{id}: business version {version}, events {:?}",
                got
            ));
        }
    }

    // The stream.
    f.messages = records.len();
    let deliveries: Vec<Delivery> = records.iter().map(Record::delivery).collect();
    let report = Report::of(&deliveries);
    f.delivered = report.unique;
    f.duplicated = report.duplicates;
    f.order_violations = report.order_violations;
    let mut first: HashMap<Uuid, SystemTime> = HashMap::new();
    let mut foreign = HashSet::new();
    for r in records {
        match Uuid::parse_str(&r.event_id) {
            Ok(id) => {
                first.entry(id).or_insert(r.stored_at);
            }
            Err(_) => {
                foreign.insert(r.sequence);
            }
        }
    }
    for (id, row) in &committed {
        if !first.contains_key(id) {
            f.lost.push(format!(
                "{id} ({} v{}, outbox status {})",
                row.aggregate_id, row.version, row.status
            ));
        }
    }
    f.lost.sort();
    for id in first.keys() {
        if !committed.contains_key(id) {
            let fate = by_id.get(id).map(|w| w.fate);
            if fate == Some(Fate::RolledBack) {
                f.phantoms.1 += 1;
            }
            f.phantoms.0.push(format!("{id} (writer: {fate:?})"));
        }
    }
    for sequence in foreign {
        f.phantoms
            .0
            .push(format!("stream message #{sequence} without an event id"));
    }

    let mut lags: Vec<Duration> = ledger
        .iter()
        .filter_map(|w| match w.fate {
            Fate::Committed(at) => first
                .get(&w.event_id)
                .map(|d| d.duration_since(at).unwrap_or_default()),
            _ => None,
        })
        .collect();
    lags.sort_unstable();
    if !lags.is_empty() {
        let at = |q: f64| lags[((lags.len() - 1) as f64 * q).round() as usize];
        f.lag = (at(0.5), at(0.99), at(1.0));
    }
    f
}

impl fmt::Display for Figures {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = |out: &mut fmt::Formatter<'_>, name: &str, value: String| {
            writeln!(out, "  {name:<38} {value}")
        };
        line(
            out,
            "events written (committed)",
            self.committed.to_string(),
        )?;
        line(
            out,
            "rolled back (on purpose)",
            self.rolled_back.to_string(),
        )?;
        line(
            out,
            "aborted by a database crash",
            format!("{} (error before COMMIT)", self.aborted),
        )?;
        line(
            out,
            "commits interrupted by a crash",
            format!(
                "{} ({} committed, {} not: the table decides)",
                self.interrupted.0,
                self.interrupted.1,
                self.interrupted.0 - self.interrupted.1
            ),
        )?;
        line(
            out,
            "messages delivered (all copies)",
            self.messages.to_string(),
        )?;
        line(out, "delivered (unique)", self.delivered.to_string())?;
        line(
            out,
            "duplicated (extra copies)",
            self.duplicated.to_string(),
        )?;
        line(out, "lost (G1)", self.lost.len().to_string())?;
        line(
            out,
            "phantoms (G2)",
            format!(
                "{} ({} of them rolled back on purpose)",
                self.phantoms.0.len(),
                self.phantoms.1
            ),
        )?;
        line(
            out,
            "order violations (G4)",
            self.order_violations.to_string(),
        )?;
        line(
            out,
            &format!("lag, commit to {}", self.lag_to),
            format!(
                "p50 {:.3} s, p99 {:.3} s, worst {:.3} s",
                self.lag.0.as_secs_f64(),
                self.lag.1.as_secs_f64(),
                self.lag.2.as_secs_f64()
            ),
        )?;
        line(out, "relay kills (SIGKILL)", self.faults.kills.to_string())?;
        line(
            out,
            "relay pauses (SIGSTOP > lease TTL)",
            self.faults.pauses.to_string(),
        )?;
        line(
            out,
            "broker restarts (SIGKILL)",
            self.faults.broker_restarts.to_string(),
        )?;
        line(
            out,
            "broker hangs (SIGSTOP)",
            self.faults.broker_hangs.to_string(),
        )?;
        line(
            out,
            "database restarts (SIGKILL)",
            self.faults.database_restarts.to_string(),
        )?;
        line(
            out,
            "relay exits (restarted by supervisor)",
            self.relay_exits.to_string(),
        )?;
        line(out, "consumer resumes", self.consumer_resumes.to_string())?;
        if self.purges.ran + self.purges.failed > 0 {
            line(
                out,
                "purges beside the relays (ok / failed)",
                format!("{} / {}", self.purges.ran, self.purges.failed),
            )?;
        }
        line(
            out,
            "outbox rows not published at the end",
            self.unpublished.to_string(),
        )?;
        Ok(())
    }
}
