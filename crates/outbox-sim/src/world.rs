//! Everything the simulated processes share: the database, the broker's log, the relay
//! processes' states, the seeded random generator and the trace. One lock; never held across
//! an await, so every step is atomic.

use std::{
    collections::BTreeSet,
    hash::{DefaultHasher, Hasher},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use rand::{rngs::StdRng, Rng, SeedableRng};
use tokio::{sync::Notify, time::Instant};

use crate::{
    config::{Bug, Faults},
    db::Db,
};

/// One message as the broker stored it.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// Outbox row id of the event.
    pub id: i64,
    /// Relay process that published it.
    pub node: usize,
    /// Virtual time (ms).
    pub at: i64,
}

/// A relay process, as the operating system sees it.
#[derive(Clone, Debug)]
pub struct NodeState {
    /// Its relay id.
    pub name: String,
    /// False once killed.
    pub alive: bool,
    /// Stopped (SIGSTOP-like) until this virtual time (ms).
    pub paused_until: i64,
}

/// Counts of what was injected and what happened.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Relay processes killed.
    pub crashes: u64,
    /// Relay processes paused past their lease.
    pub pauses: u64,
    /// Relay processes started (restarts included).
    pub relays_started: u64,
    /// Broker outages.
    pub broker_outages: u64,
    /// Aggregates made sick (their publishes failing transiently, or never answered, for a
    /// while).
    pub sick_aggregates: u64,
    /// Of those, the ones whose publishes got no answer at all (a destination that hangs).
    pub hanging_aggregates: u64,
    /// Replication slots lost (and made again).
    pub slots_lost: u64,
    /// Database restarts.
    pub database_restarts: u64,
    /// Steps of the database clock.
    pub clock_steps: u64,
    /// Statement answers lost after commit.
    pub replies_lost: u64,
    /// Broker acks lost.
    pub acks_lost: u64,
    /// Broker acks delayed.
    pub acks_delayed: u64,
    /// Messages the broker stored twice by itself.
    pub broker_duplicates: u64,
    /// Dead events replayed by an operator.
    pub replays: u64,
    /// Dead events skipped by an operator.
    pub skips: u64,
    /// Store calls made.
    pub store_calls: u64,
    /// Publish calls made.
    pub publish_calls: u64,
}

/// The shared state.
#[derive(Debug)]
pub struct State {
    /// The database.
    pub db: Db,
    /// The broker's log, in the order it stored messages.
    pub deliveries: Vec<Delivery>,
    /// Ids the broker stored at least once.
    pub delivered: BTreeSet<i64>,
    /// Ids of rows whose transaction rolled back.
    pub rolled_back: BTreeSet<i64>,
    /// Relay processes, by node number.
    pub nodes: Vec<NodeState>,
    /// Faults in force (`Faults::none()` once chaos ends).
    pub faults: Faults,
    /// The model mutation, if any.
    pub bug: Option<Bug>,
    /// Database clock offset from virtual time (ms).
    pub skew_ms: i64,
    /// Database unavailable until this virtual time (ms).
    pub database_down_until: i64,
    /// Broker unavailable until this virtual time (ms).
    pub broker_down_until: i64,
    /// The aggregate id whose publishes fail transiently until the given virtual time (ms),
    /// and whether they hang instead (no answer at all: the publish times out).
    pub sick: Option<(String, i64, bool)>,
    /// When the operator makes the lost slot again (virtual ms).
    pub slot_back_at: Option<i64>,
    /// How many aggregates the writers write (`agg0`, `agg1`, …).
    pub aggregates: usize,
    /// Injection counts.
    pub stats: Stats,
    /// Events an operator skipped: they stay dead but no longer park their aggregate.
    pub skipped: BTreeSet<i64>,
    /// CDC: how the writers write (`None`: polling, rows only).
    pub cdc: Option<crate::config::WriteMode>,
    /// Guarantee violations seen as they happened (the oracle adds the rest at the end).
    pub violations: Vec<String>,
    rng: StdRng,
    trace_hash: DefaultHasher,
    trace: Option<Vec<String>>,
    live: bool,
}

impl State {
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random::<f64>() < p
    }

    /// A uniform draw from `low..=high`.
    pub fn between(&mut self, low: i64, high: i64) -> i64 {
        self.rng.random_range(low..=high)
    }

    /// Adds a line to the trace (virtual time first).
    pub fn trace(&mut self, now: i64, line: impl FnOnce() -> String) {
        let line = format!("{now:>8} {}", line());
        self.trace_hash.write(line.as_bytes());
        if self.live {
            eprintln!("{line}");
        }
        if let Some(t) = &mut self.trace {
            t.push(line);
        }
    }

    /// Records a guarantee violation.
    pub fn violation(&mut self, now: i64, what: String) {
        self.trace(now, || format!("VIOLATION {what}"));
        self.violations.push(what);
    }

    /// The trace's hash so far, and the trace if kept.
    pub fn trace_result(&mut self) -> (u64, Vec<String>) {
        (
            self.trace_hash.finish(),
            self.trace.take().unwrap_or_default(),
        )
    }
}

/// The world: shared state plus the virtual clock's origin.
#[derive(Debug)]
pub struct World {
    state: Mutex<State>,
    start: Instant,
    /// Notified on every commit (the database's NOTIFY).
    pub commits: Notify,
    /// Notified when a relay process dies.
    pub crashed: Notify,
}

impl World {
    /// A fresh world.
    pub fn new(seed: u64, db: Db, faults: Faults, bug: Option<Bug>, keep_trace: bool) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                db,
                deliveries: Vec::new(),
                delivered: BTreeSet::new(),
                rolled_back: BTreeSet::new(),
                nodes: Vec::new(),
                faults,
                bug,
                skew_ms: 0,
                database_down_until: 0,
                broker_down_until: 0,
                sick: None,
                slot_back_at: None,
                aggregates: 0,
                stats: Stats::default(),
                cdc: None,
                skipped: BTreeSet::new(),
                violations: Vec::new(),
                rng: StdRng::seed_from_u64(seed),
                trace_hash: DefaultHasher::new(),
                trace: keep_trace.then(Vec::new),
                live: std::env::var_os("OUTBOX_SIM_LIVE").is_some(),
            }),
            start: Instant::now(),
            commits: Notify::new(),
            crashed: Notify::new(),
        })
    }

    /// The state, locked.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("not poisoned")
    }

    /// Virtual milliseconds since the start.
    pub fn now(&self) -> i64 {
        self.start.elapsed().as_millis() as i64
    }

    /// Sleeps `ms` virtual milliseconds.
    pub async fn sleep_ms(&self, ms: i64) {
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms as u64)).await;
        }
    }

    /// A random delay of `low..=high` ms.
    pub async fn latency(&self, low: i64, high: i64) {
        let ms = self.lock().between(low, high);
        self.sleep_ms(ms).await;
    }

    /// Registers a new relay process; returns its node number.
    pub fn add_node(&self, name: String) -> usize {
        let mut s = self.lock();
        s.nodes.push(NodeState {
            name,
            alive: true,
            paused_until: 0,
        });
        s.stats.relays_started += 1;
        s.nodes.len() - 1
    }

    /// Inserts and commits one good event (a writer outside the simulation, for tests that
    /// drive the model directly); returns its id.
    pub fn commit_event(&self, key: crate::row::Key, version: i64, payload: Vec<u8>) -> i64 {
        let now = self.now();
        let mut s = self.lock();
        let db_now = now + s.skew_ms;
        let id =
            s.db.insert(key, version, crate::row::Content::Good, payload, db_now);
        s.db.commit(&[id], now);
        id
    }

    /// Waits while the process is stopped; never returns if it was killed.
    pub async fn gate(&self, node: usize) {
        loop {
            let (alive, until) = {
                let s = self.lock();
                (s.nodes[node].alive, s.nodes[node].paused_until)
            };
            if !alive {
                std::future::pending::<()>().await;
            }
            let now = self.now();
            if until <= now {
                return;
            }
            self.sleep_ms(until - now).await;
        }
    }

    /// Kills the process (SIGKILL): it takes no further step, and the supervisor restarts it.
    pub async fn crash(&self, node: usize, at: &str) -> ! {
        {
            let now = self.now();
            let mut s = self.lock();
            s.nodes[node].alive = false;
            s.stats.crashes += 1;
            let name = s.nodes[node].name.clone();
            s.trace(now, || format!("CRASH {name} {at}"));
        }
        self.crashed.notify_one();
        std::future::pending::<()>().await;
        unreachable!("a killed process takes no further step")
    }

    /// Stops the process for longer than a lease lasts (SIGSTOP, a long GC pause).
    pub fn pause(&self, node: usize, lease_ttl_ms: i64, at: &str) {
        let now = self.now();
        let mut s = self.lock();
        let ms = s.between(lease_ttl_ms, lease_ttl_ms * 3);
        s.nodes[node].paused_until = now + ms;
        s.stats.pauses += 1;
        let name = s.nodes[node].name.clone();
        s.trace(now, || format!("PAUSE {name} {ms}ms {at}"));
    }
}
