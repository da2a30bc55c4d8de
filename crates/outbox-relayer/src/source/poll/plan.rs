//! What the polling loop decides between claims, kept in one struct: which partitions to claim
//! from and from which floor, how many rows, when to claim again and how long to wait, and the
//! rows and bytes in flight. Pure (no database, broker or clock of its own: the loop passes
//! `now`), so that tests drive it claim by claim.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use tokio::time::Instant;

use crate::{
    complete::Tally,
    config::RelayConfig,
    retry::{jittered, Backoff},
    store::{ClaimedRow, Fence},
};

/// The shortest wait for more events after a claim that found some (see
/// [`ClaimPlan::wait`]), when `claim_linger` is 0.
const MIN_POLL: Duration = Duration::from_millis(1);

/// The state of the polling loop between claims.
pub(super) struct ClaimPlan {
    config: RelayConfig,
    /// Partitions with a batch in flight: not claimed from again until it finishes.
    busy: HashSet<i32>,
    /// Rows asked of the next claim, adapted to the backlog.
    batch_size: i64,
    /// Turns of the partitions' order, so that each leads a claim in turn.
    rotation: usize,
    /// Per-partition scan floors (a hint, see `postgres/sql/claim.sql`).
    floors: HashMap<i32, i64>,
    /// When the floors were last cleared for a full scan (every `rescan_interval`).
    full_scan_at: Instant,
    /// Whether more may be pending: false once every partition is busy or a wait is due.
    more: bool,
    /// No claim before this: the database or the broker is failing.
    paused_until: Instant,
    /// No claim before this, unless the last one came back full (`claim_linger`).
    linger_until: Instant,
    /// The pause after batches that only failed transiently (the broker is failing).
    circuit: Backoff,
    /// The pause after a failed claim.
    db_backoff: Backoff,
    /// Bytes the batches in flight may hold (`max_inflight_bytes`).
    budget: i64,
    /// Bytes the batches in flight hold.
    inflight_bytes: i64,
    /// How long an idle relay waits right after a claim that found events.
    eager_poll: Duration,
    /// How long an idle relay waits for a wake-up before it claims again: `eager_poll` right
    /// after a claim that found events (more are likely on their way, from writers that may
    /// not NOTIFY), doubling while claims come back empty, up to `poll_interval`.
    idle_poll: Duration,
}

/// A claim to run: from these partitions (each with its scan floor), this many rows, within
/// this many bytes.
pub(super) struct Claim {
    /// The partitions claimed from, with their fences.
    free: Vec<Fence>,
    /// Partition and scan floor, in the order the claim reads them.
    pub(super) partitions: Vec<(i32, i64)>,
    pub(super) batch_size: i64,
    /// Bytes the claim's rows may hold.
    pub(super) byte_room: i64,
}

/// A batch to publish: the fences of the partitions its rows came from, and its bytes.
pub(super) struct Batch {
    pub(super) fences: Vec<Fence>,
    pub(super) bytes: i64,
}

impl ClaimPlan {
    pub(super) fn new(config: &RelayConfig, now: Instant) -> Self {
        Self {
            busy: HashSet::new(),
            batch_size: config.min_batch_size,
            rotation: 0,
            floors: HashMap::new(),
            full_scan_at: now,
            more: true,
            paused_until: now,
            linger_until: now,
            circuit: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            db_backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
            budget: i64::try_from(config.max_inflight_bytes).unwrap_or(i64::MAX),
            inflight_bytes: 0,
            eager_poll: config.claim_linger.max(MIN_POLL).min(config.poll_interval),
            idle_poll: config.poll_interval,
            config: config.clone(),
        }
    }

    /// The partitions with a batch in flight.
    pub(super) fn busy(&self) -> &HashSet<i32> {
        &self.busy
    }

    /// Bytes the batches in flight hold.
    pub(super) fn inflight_bytes(&self) -> i64 {
        self.inflight_bytes
    }

    /// Whether every batch slot or the byte budget is taken.
    fn full(&self, inflight: usize) -> bool {
        inflight >= self.config.max_inflight_batches || self.inflight_bytes >= self.budget
    }

    /// Whether to claim now: more may be pending, no pause or linger is due, and a batch slot
    /// and bytes are free (`inflight` batches are in flight).
    pub(super) fn ready(&self, now: Instant, inflight: usize) -> bool {
        self.more && now >= self.paused_until && now >= self.linger_until && !self.full(inflight)
    }

    /// The next claim, over the `usable` partitions (those this relay leases) that have no
    /// batch in flight, rotated so that each leads in turn; `None` when every one is busy
    /// (nothing more to claim until a batch finishes).
    pub(super) fn next_claim(&mut self, usable: Vec<Fence>, now: Instant) -> Option<Claim> {
        let mut free: Vec<Fence> = usable
            .into_iter()
            .filter(|(p, _)| !self.busy.contains(p))
            .collect();
        if free.is_empty() {
            self.more = false;
            return None;
        }
        self.rotation = self.rotation.wrapping_add(1);
        let shift = self.rotation % free.len();
        free.rotate_left(shift);
        if now.duration_since(self.full_scan_at) >= self.config.rescan_interval {
            self.floors.clear();
            self.full_scan_at = now;
        }
        let partitions = free
            .iter()
            .map(|f| (f.0, self.floors.get(&f.0).copied().unwrap_or(0)))
            .collect();
        Some(Claim {
            free,
            partitions,
            batch_size: self.batch_size,
            byte_room: self.budget - self.inflight_bytes,
        })
    }

    /// Takes what `claim`, started at `started`, returned: adapts the batch size, decides when
    /// to claim next, moves the scan floors, and returns the batch to publish when rows came.
    /// `cut`: the claim stopped at the byte budget (more is waiting, whatever the row count).
    pub(super) fn claimed(
        &mut self,
        claim: Claim,
        rows: &[ClaimedRow],
        cut: bool,
        started: Instant,
    ) -> Option<Batch> {
        self.db_backoff.reset();
        let full = rows.len() as i64 >= claim.batch_size || cut;
        if !cut {
            self.batch_size = adapt(self.batch_size, rows.len(), &self.config);
        }
        self.more = full;
        self.linger_until = if full {
            started
        } else {
            started + self.config.claim_linger
        };
        if !full {
            // Keeping up: the next claim scans from the start, so a row that committed after
            // later ones is found at once. Floors only pay while a backlog keeps claims full.
            self.floors.clear();
        }
        self.idle_poll = if rows.is_empty() {
            (self.idle_poll * 2).min(self.config.poll_interval)
        } else {
            self.eager_poll
        };
        if rows.is_empty() {
            return None;
        }
        if full {
            // The new floor of each partition read: the lowest id found pending there.
            let mut lowest: HashMap<i32, i64> = HashMap::new();
            for row in rows {
                let id = lowest.entry(row.partition).or_insert(row.id);
                *id = (*id).min(row.id);
            }
            self.floors.extend(lowest);
        }
        let taken: HashSet<i32> = rows.iter().map(|r| r.partition).collect();
        self.busy.extend(&taken);
        let fences = claim
            .free
            .into_iter()
            .filter(|(p, _)| taken.contains(p))
            .collect();
        let bytes: i64 = rows.iter().map(|r| r.row_bytes.max(0)).sum();
        self.inflight_bytes += bytes;
        Some(Batch { fences, bytes })
    }

    /// A claim failed: no claim for the returned (growing, jittered) delay.
    pub(super) fn claim_failed(&mut self, now: Instant) -> Duration {
        let delay = jittered(&mut self.db_backoff);
        self.paused_until = now + delay;
        delay
    }

    /// A batch over `partitions`, holding `bytes`, finished with `tally`: its partitions are
    /// free and its bytes back in the budget. Returns the pause of the publisher when the
    /// batch only failed transiently (the broker is failing; the pause grows while it does).
    pub(super) fn batch_done(
        &mut self,
        partitions: &[i32],
        bytes: i64,
        tally: &Tally,
        now: Instant,
    ) -> Option<Duration> {
        for p in partitions {
            self.busy.remove(p);
        }
        self.inflight_bytes -= bytes;
        self.more = true;
        if tally.transient > 0 && tally.published == 0 {
            let delay = jittered(&mut self.circuit);
            self.paused_until = now + delay;
            return Some(delay);
        }
        if tally.published > 0 {
            self.circuit.reset();
        }
        None
    }

    /// Something may be pending (a NOTIFY, a lease change, the poll timer).
    pub(super) fn wake(&mut self) {
        self.more = true;
    }

    /// How long the loop waits, at `now` with `inflight` batches in flight, when it does not
    /// claim: out the pause or linger while more is pending and a slot is free; the poll
    /// interval as a mere fallback when every slot is taken (then only a finished batch frees
    /// one); otherwise (nothing to claim) the idle poll.
    pub(super) fn wait(&self, now: Instant, inflight: usize) -> Duration {
        let full = self.full(inflight);
        if self.more && !full {
            self.paused_until
                .max(self.linger_until)
                .saturating_duration_since(now)
        } else if full {
            self.config.poll_interval
        } else {
            self.idle_poll
        }
    }
}

/// Doubles the batch while claims come back full; halves it when they come back under a
/// quarter full.
fn adapt(current: i64, got: usize, config: &RelayConfig) -> i64 {
    let got = got as i64;
    let next = if got >= current {
        current * 2
    } else if got < current / 4 {
        current / 2
    } else {
        current
    };
    next.clamp(config.min_batch_size, config.max_batch_size)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
