//! What one simulated run contains: its size, its faults, and optional mutations of the model.

use std::time::Duration;

/// A deliberate bug in the model, to show that the oracle catches what it claims to catch.
/// Never set in a normal run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Bug {
    /// The claim keeps a high-water mark on id per partition (the classic sequence-gap bug):
    /// rows that commit after later ones are skipped. Breaks G1.
    HighWaterMark,
    /// The claim also sees uncommitted rows (a dirty read). Breaks G2.
    ReadUncommitted,
    /// The claim ignores holds: retries and parked aggregates are not waited for. Breaks G4.
    IgnoreHolds,
    /// The broker acknowledges without keeping the message. Breaks G1.
    AckWithoutStoring,
    /// The claim trusts its floors: a row that commits late below a floor no longer holds back
    /// its aggregate's later rows (the relay's bug before the `_pending_aggregate` check).
    /// Breaks G4.
    UncheckedFloors,
    /// CDC: the slot confirms what the stream sent, not what the relay confirmed (a relay
    /// that confirms on receipt, before publishing).
    ConfirmOnReceipt,
}

/// Probabilities of the faults injected while chaos is on (per call or per second).
#[derive(Clone, Debug)]
pub struct Faults {
    /// Per store or publish call: the relay process dies before the call takes effect.
    pub crash_before: f64,
    /// Per call: the relay dies after the call took effect, before it hears the answer.
    pub crash_after: f64,
    /// Per call: the relay process stops (a long GC or SIGSTOP) for longer than its lease.
    pub pause: f64,
    /// Per store call: the statement committed but the answer was lost (connection reset).
    pub reply_lost: f64,
    /// Per publish: the broker stores the message but the ack never arrives.
    pub ack_lost: f64,
    /// Per publish: the ack arrives late, possibly after the publish timeout.
    pub ack_delayed: f64,
    /// Per publish: the broker stores the message twice (a producer-side retry) and acks.
    pub broker_duplicate: f64,
    /// Per second: the broker becomes unavailable for a while.
    pub broker_outage: f64,
    /// Per second: one aggregate's publishes fail transiently for 2–15 s (its Kafka partition
    /// has no leader, its webhook answers 503), while the others go through.
    pub sick_aggregate: f64,
    /// Per second (CDC, table mode): the replication slot is lost (`max_slot_wal_keep_size`);
    /// 0.5–5 s later an operator makes it again (`outbox migrate --cdc`), recording the rows
    /// to catch up from the table.
    pub slot_loss: f64,
    /// Per second: the database restarts (unavailable for a while; statements in flight fail).
    pub database_restart: f64,
    /// Per second: the database clock steps forwards or backwards.
    pub clock_step: f64,
    /// Per written event: the broker always rejects it (a permanent failure).
    pub poison: f64,
    /// Per written event: another program wrote it with malformed headers.
    pub malformed: f64,
    /// Per transaction: it rolls back.
    pub rollback: f64,
    /// Per transaction: it stays open long (commits after many later ones).
    pub long_transaction: f64,
    /// Per committed transaction (CDC): its commit reaches the stream 50 ms to 3 s before
    /// queries see its rows, as a commit waiting for a synchronous standby does.
    pub invisible_commit: f64,
    /// Operator actions per second: `replay` or `skip` of a dead event.
    pub operator: f64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            crash_before: 0.002,
            crash_after: 0.002,
            pause: 0.001,
            reply_lost: 0.003,
            ack_lost: 0.01,
            ack_delayed: 0.01,
            broker_duplicate: 0.005,
            broker_outage: 0.05,
            sick_aggregate: 0.1,
            slot_loss: 0.03,
            database_restart: 0.03,
            clock_step: 0.03,
            poison: 0.002,
            malformed: 0.001,
            rollback: 0.08,
            long_transaction: 0.05,
            invisible_commit: 0.05,
            operator: 0.3,
        }
    }
}

impl Faults {
    /// No faults at all: the calm baseline.
    pub fn none() -> Self {
        Self {
            crash_before: 0.0,
            crash_after: 0.0,
            pause: 0.0,
            reply_lost: 0.0,
            ack_lost: 0.0,
            ack_delayed: 0.0,
            broker_duplicate: 0.0,
            broker_outage: 0.0,
            sick_aggregate: 0.0,
            slot_loss: 0.0,
            database_restart: 0.0,
            clock_step: 0.0,
            poison: 0.0,
            malformed: 0.0,
            rollback: 0.0,
            long_transaction: 0.0,
            invisible_commit: 0.0,
            operator: 0.0,
        }
    }
}

/// The shape of a run. The relay settings themselves are drawn from the seed.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Relay instances running at once.
    pub relays: usize,
    /// Concurrent writers (each owns a share of the aggregates).
    pub writers: usize,
    /// Aggregates written to.
    pub aggregates: usize,
    /// How long the writers write, in virtual time; chaos runs for as long.
    pub write_for: Duration,
    /// After the writers stop and the faults end, how long the relays get to publish
    /// everything before the run counts as stalled.
    pub settle_within: Duration,
    /// Faults while chaos is on.
    pub faults: Faults,
    /// A deliberate model bug (oracle self-test).
    pub bug: Option<Bug>,
    /// Keep the full trace (for replaying a failing seed); otherwise only its hash.
    pub keep_trace: bool,
    /// Where the relays read events from.
    pub source: Source,
    /// CDC: how the writers write (default: drawn from the seed).
    pub write_mode: Option<WriteMode>,
}

/// Where the relays read events from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Source {
    /// Claims on the table (`mode = "poll"`).
    #[default]
    Poll,
    /// The replication stream (`mode = "cdc"`).
    Cdc,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            relays: 3,
            writers: 4,
            aggregates: 24,
            write_for: Duration::from_secs(20),
            settle_within: Duration::from_secs(180),
            faults: Faults::default(),
            bug: None,
            keep_trace: false,
            source: Source::Poll,
            write_mode: None,
        }
    }
}

/// How the writers write their events (CDC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WriteMode {
    /// Rows that stay in the table.
    Table,
    /// Rows inserted and deleted in their transaction.
    ZeroGrowth,
    /// Logical messages only.
    TableLess,
}
