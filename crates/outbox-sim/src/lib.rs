//! # outbox-sim
//!
//! Deterministic simulation of the relay. The relay engine (`outbox_relayer::Relay`: leases,
//! claims, ordered lanes, retries, dead letters, completion) runs **unchanged** over an
//! in-memory database and broker, on a virtual clock, with faults drawn from a seed:
//!
//! * relay processes killed at any step: before a statement or a publish takes effect, after
//!   it took effect but before the answer (between publish and ack, between ack and mark,
//!   mid-batch), and restarted;
//! * relay processes stopped (SIGSTOP, a long GC pause) for longer than their lease, then
//!   resumed;
//! * acks lost, acks delayed past the publish timeout, messages stored twice by the broker,
//!   broker outages, one aggregate's publishes failing transiently for seconds (a partition
//!   without a leader, an endpoint answering 503);
//! * database restarts (statements fail; a commit's answer can be lost), steps of the database
//!   clock (forwards and backwards) against the relays' clocks;
//! * transactions that commit long after later ones, rollbacks, events the broker rejects and
//!   malformed rows.
//!
//! Several relays run at once. After the chaos, the faults stop and the relays get time to
//! finish; then [`oracle::check`] holds the broker's log and the tables against G1–G4 and counts
//! duplicates. A run is a pure function of its seed: the same seed gives the same trace (its
//! hash is in the [`Report`]), so a failing seed replays exactly, with `--trace`.
//!
//! ```no_run
//! let report = outbox_sim::run(42, &outbox_sim::SimConfig::default());
//! assert!(report.violations.is_empty(), "{report}");
//! ```

pub mod cdc;
pub mod config;
pub mod db;
pub mod db_admin;
pub mod db_cdc;
pub mod node;
pub mod oracle;
pub mod row;
pub mod supervisor;
pub mod wal;
pub mod world;
pub mod writer;

use std::{fmt, time::Duration};

use outbox_relayer::{retry::RetryPolicy, RelayConfig};
use rand::{rngs::StdRng, Rng, SeedableRng};

pub use config::{Bug, Faults, SimConfig, Source, WriteMode};

use crate::{
    db::Db,
    supervisor::Supervisor,
    world::{Stats, World},
};

/// The outcome of one seed.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Relay settings drawn for this seed.
    pub settings: String,
    /// Virtual time the run took (ms).
    pub virtual_ms: i64,
    /// What the oracle counted.
    pub verdict: oracle::Verdict,
    /// Events rolled back.
    pub rolled_back: u64,
    /// Faults injected.
    pub stats: Stats,
    /// Every violation, in the order found.
    pub violations: Vec<String>,
    /// Hash of the trace: equal for two runs of one seed.
    pub trace_hash: u64,
    /// The trace, when asked for.
    pub trace: Vec<String>,
}

impl Report {
    /// Whether every guarantee held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = &self.verdict;
        let s = &self.stats;
        writeln!(
            f,
            "seed {}: {} ({:.1} s virtual; {})",
            self.seed,
            if self.ok() { "ok" } else { "FAILED" },
            self.virtual_ms as f64 / 1000.0,
            self.settings
        )?;
        writeln!(
            f,
            "  events: {} committed, {} rolled back, {} delivered, {} duplicates, {} dead, {} parked; worst lag {} ms",
            v.committed, self.rolled_back, v.delivered, v.duplicates, v.dead, v.parked, v.worst_lag_ms
        )?;
        writeln!(
            f,
            "  faults: {} crashes, {} pauses, {} relay starts, {} broker outages, {} sick aggregates ({} hanging), {} slots lost, {} database restarts, {} clock steps, {} replies lost, {} acks lost, {} acks delayed, {} broker duplicates, {} replays, {} skips",
            s.crashes, s.pauses, s.relays_started, s.broker_outages, s.sick_aggregates,
            s.hanging_aggregates, s.slots_lost, s.database_restarts, s.clock_steps, s.replies_lost, s.acks_lost, s.acks_delayed, s.broker_duplicates,
            s.replays, s.skips
        )?;
        writeln!(f, "  trace hash {:016x}", self.trace_hash)?;
        for violation in &self.violations {
            writeln!(f, "  VIOLATION {violation}")?;
        }
        Ok(())
    }
}

/// The model alone, without faults: its world and one connection to its database, for running
/// the relay's store conformance suite against it (the model must behave as PostgreSQL and
/// SQLite do).
pub fn model(partitions: i32) -> (std::sync::Arc<World>, node::SimStore) {
    let world = World::new(0, Db::new(partitions, None), Faults::none(), None, false);
    let node = world.add_node("conformance".to_owned());
    let store = node::SimStore::new(world.clone(), node, Duration::from_secs(30));
    (world, store)
}

/// Relay settings drawn from the seed, within what a deployment could choose, scaled down so
/// that leases expire and batches turn over often.
fn relay_settings(rng: &mut StdRng) -> RelayConfig {
    let min_batch = rng.random_range(1..=8);
    RelayConfig {
        min_batch_size: min_batch,
        max_batch_size: rng.random_range(min_batch..=64),
        max_inflight_batches: rng.random_range(1..=4),
        lane_concurrency: rng.random_range(1..=16),
        publish_timeout: Duration::from_millis(rng.random_range(300..=1500)),
        poll_interval: Duration::from_millis(rng.random_range(50..=500)),
        rescan_interval: Duration::from_millis(rng.random_range(200..=2000)),
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(rng.random_range(200..=600)),
        stats_interval: Duration::from_secs(1),
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(400),
            max_transient_backoff: Duration::from_millis(400),
            max_attempts: rng.random_range(1..=4),
        },
        // Sometimes a byte budget of a few rows, so that claims are cut by it.
        max_inflight_bytes: if rng.random_bool(0.3) {
            rng.random_range(100..=2000)
        } else {
            64 << 20
        },
        ..RelayConfig::default()
    }
}

/// Runs one seed to the end and checks it.
pub fn run(seed: u64, config: &SimConfig) -> Report {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    // The relay's own random choices (backoff jitter) follow the seed too.
    outbox_relayer::retry::seed_thread_rng(Some(seed.rotate_left(17) ^ 0x6a09_e667_f3bc_c908));
    let report = runtime.block_on(simulate(seed, config));
    outbox_relayer::retry::seed_thread_rng(None);
    report
}

async fn simulate(seed: u64, config: &SimConfig) -> Report {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut relay = relay_settings(&mut rng);
    let partitions = rng.random_range(1..=12);
    let write_mode = (config.source == Source::Cdc).then(|| {
        config.write_mode.unwrap_or(match rng.random_range(0..3) {
            0 => WriteMode::Table,
            1 => WriteMode::ZeroGrowth,
            _ => WriteMode::TableLess,
        })
    });
    // CDC: the slot is created before the relays start or, with rows already in the table,
    // while the writers write (the relay catches those up from the table).
    let slot_at = match write_mode {
        Some(WriteMode::Table) if rng.random_bool(0.5) => Some(rng.random_range(100..=2000)),
        Some(_) => Some(0),
        None => None,
    };
    if write_mode.is_some() {
        relay.mode = outbox_relayer::config::Mode::Cdc;
        relay.cdc.heartbeat_interval = Duration::from_millis(rng.random_range(200..=2000));
        // Sometimes tiny, so that transactions are published in chunks.
        if rng.random_bool(0.3) {
            relay.cdc.max_transaction_events = rng.random_range(1..=4);
        }
        relay.schema = cdc::SCHEMA.into();
        relay.table = cdc::TABLE.into();
    }
    let settings = format!(
        "{}{partitions} partitions, batches {}..{}, {} in flight ({} bytes), {} lanes, max attempts {}, publish timeout {:?}",
        match write_mode {
            None => String::new(),
            Some(m) => format!(
                "cdc {m:?}{}, transactions chunked past {}, ",
                if slot_at.is_some_and(|t| t > 0) { " (slot made late)" } else { "" },
                relay.cdc.max_transaction_events
            ),
        },
        relay.min_batch_size,
        relay.max_batch_size,
        relay.max_inflight_batches,
        relay.max_inflight_bytes,
        relay.lane_concurrency,
        relay.retry.max_attempts,
        relay.publish_timeout
    );
    let world = World::new(
        rng.random(),
        Db::new(partitions, config.bug),
        config.faults.clone(),
        config.bug,
        config.keep_trace,
    );
    {
        let mut s = world.lock();
        s.cdc = write_mode;
        s.aggregates = config.aggregates;
    }
    if slot_at == Some(0) {
        world.lock().db.wal.create_slot();
    }
    let write_until = config.write_for.as_millis() as i64;
    let mut writers = Vec::new();
    for w in 0..config.writers {
        let keys = (0..config.aggregates)
            .filter(|a| a % config.writers == w)
            .map(|a| (format!("type{}", a % 3), format!("agg{a}")))
            .collect();
        writers.push(tokio::spawn(writer::write(
            world.clone(),
            w,
            keys,
            write_until,
        )));
    }
    if let Some(at) = slot_at.filter(|t| *t > 0) {
        let world = world.clone();
        tokio::spawn(async move {
            world.sleep_ms(at).await;
            let now = world.now();
            let mut s = world.lock();
            s.db.wal.create_slot();
            let max_id = s.db.next_id - 1;
            s.db.catch_up_max_id = Some(max_id);
            s.trace(now, || format!("SLOT CREATED; catch up to {max_id}"));
        });
    }
    let mut supervisor = Supervisor::start(world.clone(), relay.clone(), config.relays);
    supervisor.run_until(write_until, |_| false).await;

    // Chaos ends: no new faults; open transactions finish; dead relays come back.
    {
        let now = world.now();
        let mut s = world.lock();
        s.faults = Faults::none();
        s.trace(now, || "CHAOS ENDS".to_owned());
    }
    for w in writers {
        w.await.expect("writer task");
    }
    supervisor.revive_all();
    let deadline = world.now() + config.settle_within.as_millis() as i64;
    // Settled only when it stays so: a publish whose ack was lost is at the broker, and in the
    // table-free write modes nowhere else until its timeout hands it to the table path, where
    // it is pending again (and published again).
    let calm = (relay.publish_timeout + relay.lease_ttl).as_millis() as i64 * 2;
    loop {
        supervisor
            .run_until(deadline, |w| oracle::settled(&w.lock()))
            .await;
        let until = (world.now() + calm).min(deadline);
        supervisor
            .run_until(until, |w| !oracle::settled(&w.lock()))
            .await;
        if world.now() >= deadline || oracle::settled(&world.lock()) {
            break;
        }
    }
    let settled = oracle::settled(&world.lock());
    let stuck = supervisor.shutdown(relay.lease_ttl * 10).await;

    let now = world.now();
    let mut s = world.lock();
    let verdict = oracle::check(&s);
    let mut violations = std::mem::take(&mut s.violations);
    if !settled {
        violations.push(format!(
            "liveness: events still pending {} s after the faults ended",
            config.settle_within.as_secs()
        ));
    }
    violations.extend(stuck);
    violations.extend(verdict.violations.iter().cloned());
    let (trace_hash, trace) = s.trace_result();
    Report {
        seed,
        settings,
        virtual_ms: now,
        verdict,
        rolled_back: s.rolled_back.len() as u64,
        stats: s.stats.clone(),
        violations,
        trace_hash,
        trace,
    }
}

/// Totals over many seeds.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// Seeds that found a violation.
    pub failed: Vec<u64>,
    /// Events committed, summed.
    pub committed: u64,
    /// Events delivered (distinct), summed.
    pub delivered: u64,
    /// Duplicates, summed.
    pub duplicates: u64,
    /// Events lost: committed good events that never reached the broker.
    pub lost: u64,
    /// Order violations (G4).
    pub order_violations: u64,
    /// Phantoms (G2).
    pub phantoms: u64,
    /// Dead letters (all unpublishable by construction).
    pub dead: u64,
    /// Faults, summed.
    pub stats: Stats,
    /// Worst commit-to-first-delivery lag over all seeds (virtual ms).
    pub worst_lag_ms: i64,
}

impl Summary {
    /// Adds up `reports`.
    pub fn of(reports: &[Report]) -> Self {
        let mut t = Self::default();
        for r in reports {
            t.seeds += 1;
            if !r.ok() {
                t.failed.push(r.seed);
            }
            let v = &r.verdict;
            t.committed += v.committed;
            t.delivered += v.delivered;
            t.duplicates += v.duplicates;
            t.dead += v.dead;
            t.worst_lag_ms = t.worst_lag_ms.max(v.worst_lag_ms);
            let count = |prefix: &str| {
                r.violations
                    .iter()
                    .filter(|x| x.starts_with(prefix))
                    .count() as u64
            };
            t.lost += count("G1");
            t.order_violations += count("G4");
            t.phantoms += count("G2");
            let (a, b) = (&mut t.stats, &r.stats);
            a.crashes += b.crashes;
            a.pauses += b.pauses;
            a.relays_started += b.relays_started;
            a.broker_outages += b.broker_outages;
            a.sick_aggregates += b.sick_aggregates;
            a.hanging_aggregates += b.hanging_aggregates;
            a.slots_lost += b.slots_lost;
            a.database_restarts += b.database_restarts;
            a.clock_steps += b.clock_steps;
            a.replies_lost += b.replies_lost;
            a.acks_lost += b.acks_lost;
            a.acks_delayed += b.acks_delayed;
            a.broker_duplicates += b.broker_duplicates;
            a.replays += b.replays;
            a.skips += b.skips;
            a.store_calls += b.store_calls;
            a.publish_calls += b.publish_calls;
        }
        t.failed.sort_unstable();
        t
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        writeln!(
            f,
            "seeds {}  failed {}{}",
            self.seeds,
            self.failed.len(),
            if self.failed.is_empty() {
                String::new()
            } else {
                format!(" (first: {:?})", &self.failed[..self.failed.len().min(10)])
            }
        )?;
        writeln!(
            f,
            "events committed {}  delivered {}  lost {}  duplicates {}  order violations {}  phantoms {}  dead letters {}  worst lag {} ms",
            self.committed, self.delivered, self.lost, self.duplicates, self.order_violations,
            self.phantoms, self.dead, self.worst_lag_ms
        )?;
        write!(
            f,
            "faults: crashes {}  pauses {}  broker outages {}  sick aggregates {} ({} hanging)  slots lost {}  database restarts {}  clock steps {}  replies lost {}  acks lost {}  acks delayed {}  broker duplicates {}  replays {}  skips {}  ({} store calls, {} publishes)",
            s.crashes, s.pauses, s.broker_outages, s.sick_aggregates, s.hanging_aggregates,
            s.slots_lost,
            s.database_restarts, s.clock_steps, s.replies_lost, s.acks_lost, s.acks_delayed, s.broker_duplicates, s.replays,
            s.skips, s.store_calls, s.publish_calls
        )
    }
}
