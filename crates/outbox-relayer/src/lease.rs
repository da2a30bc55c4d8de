//! Partition leases: which partitions this relay may publish, and for how long.
//!
//! A background task ([`run`]) heartbeats every `heartbeat_interval`: it records the relay as
//! alive, computes its fair share of the partitions among the live relays (sorted by id, the
//! first `P mod n` take one extra), renews the leases it holds, acquires free or expired ones up
//! to its share, and marks extra ones for release. Releasing is done by the relay loop, and
//! only for partitions with nothing in flight, so a partition changes hands between batches.
//!
//! Safety does not depend on timing: every write the relay makes is fenced by the lease epoch in
//! SQL. Timing only limits duplicates: a lease counts as valid locally until three quarters of
//! its TTL after the renewal was *sent*, which is always before the database lets another relay
//! take it, so a relay that stops hearing from the database stops publishing first.
//!
//! The lease statements run on connections of their own (see `PgStore`), so that a claim, mark
//! or purge holding the relay's pool cannot delay a renewal; each tick is bounded in time. A
//! relay whose loop has not turned for `stall_timeout` (stuck in a call that never returns)
//! gives its leases up and leaves the live set until the loop turns again, so that the other
//! relays take its partitions over instead of waiting on it for ever.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::store::{Fence, Store};

#[derive(Clone, Copy, Debug)]
struct Held {
    epoch: i64,
    valid_until: Instant,
    releasing: bool,
}

/// The leases this relay holds, shared between the lease task, the relay loop and the lanes.
#[derive(Debug, Default)]
pub struct Leases {
    held: Mutex<HashMap<i32, Held>>,
    changed: Notify,
}

impl Leases {
    /// Whether `partition` is still held at `epoch` and its local deadline has not passed.
    pub fn is_valid(&self, partition: i32, epoch: i64) -> bool {
        let held = self.held.lock().expect("not poisoned");
        held.get(&partition)
            .is_some_and(|h| h.epoch == epoch && Instant::now() < h.valid_until)
    }

    /// How long `partition` stays valid at `epoch` from now; `None` when it is not valid.
    pub fn remaining(&self, partition: i32, epoch: i64) -> Option<Duration> {
        let held = self.held.lock().expect("not poisoned");
        let h = held.get(&partition).filter(|h| h.epoch == epoch)?;
        let left = h.valid_until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// Valid leases that may take new work (not being released), sorted by partition.
    pub fn usable(&self) -> Vec<Fence> {
        let now = Instant::now();
        let held = self.held.lock().expect("not poisoned");
        let mut out: Vec<Fence> = held
            .iter()
            .filter(|(_, h)| !h.releasing && now < h.valid_until)
            .map(|(p, h)| (*p, h.epoch))
            .collect();
        out.sort_unstable();
        out
    }

    /// Every lease held, valid or not.
    pub fn all(&self) -> Vec<Fence> {
        let held = self.held.lock().expect("not poisoned");
        let mut out: Vec<Fence> = held.iter().map(|(p, h)| (*p, h.epoch)).collect();
        out.sort_unstable();
        out
    }

    /// Number of leases held.
    pub fn count(&self) -> usize {
        self.held.lock().expect("not poisoned").len()
    }

    /// Removes and returns the leases marked for release that are not in `busy`.
    pub fn take_releasable(&self, busy: &HashSet<i32>) -> Vec<Fence> {
        let mut held = self.held.lock().expect("not poisoned");
        let ready: Vec<Fence> = held
            .iter()
            .filter(|(p, h)| h.releasing && !busy.contains(p))
            .map(|(p, h)| (*p, h.epoch))
            .collect();
        for (p, _) in &ready {
            held.remove(p);
        }
        ready
    }

    /// Removes and returns every lease (shutdown).
    pub fn take_all(&self) -> Vec<Fence> {
        let mut held = self.held.lock().expect("not poisoned");
        held.drain().map(|(p, h)| (p, h.epoch)).collect()
    }

    /// Resolves when leases were gained or marked for release.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    fn renewed(&self, still_held: &[i32], valid_until: Instant) {
        let mut held = self.held.lock().expect("not poisoned");
        let keep: HashSet<i32> = still_held.iter().copied().collect();
        held.retain(|p, _| keep.contains(p));
        for h in held.values_mut() {
            h.valid_until = valid_until;
        }
    }

    fn add(&self, gained: &[Fence], valid_until: Instant) {
        let mut held = self.held.lock().expect("not poisoned");
        for (p, epoch) in gained {
            held.insert(
                *p,
                Held {
                    epoch: *epoch,
                    valid_until,
                    releasing: false,
                },
            );
        }
        drop(held);
        if !gained.is_empty() {
            self.changed.notify_one();
        }
    }

    /// Marks the highest-numbered leases beyond `target` for release; returns how many are
    /// held and not releasing afterwards.
    fn shed_to(&self, target: usize) -> usize {
        let mut held = self.held.lock().expect("not poisoned");
        let mut keeping: Vec<i32> = held
            .iter()
            .filter(|(_, h)| !h.releasing)
            .map(|(p, _)| *p)
            .collect();
        keeping.sort_unstable();
        let mut marked = false;
        while keeping.len() > target {
            let p = keeping.pop().expect("non-empty");
            held.get_mut(&p).expect("held").releasing = true;
            marked = true;
        }
        let n = keeping.len();
        drop(held);
        if marked {
            self.changed.notify_one();
        }
        n
    }

    /// Lets every lease lapse locally until the next renewal confirms it. Also for a source
    /// whose statement was fenced off: the leases were taken over, which the heartbeat learns
    /// only at its next renewal, and until then they must not be offered again.
    pub(crate) fn expire_all(&self) {
        let mut held = self.held.lock().expect("not poisoned");
        let now = Instant::now();
        for h in held.values_mut() {
            h.valid_until = h.valid_until.min(now);
        }
    }
}

/// This relay's share of `partitions` among the sorted `live` relay ids.
pub fn fair_share(partitions: i32, live: &[String], me: &str) -> usize {
    let n = live.len().max(1);
    let index = live.iter().position(|id| id == me).unwrap_or(n - 1);
    let p = partitions.max(0) as usize;
    p / n + usize::from(index < p % n)
}

/// Settings of the lease task.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// This relay's id.
    pub relay_id: String,
    /// Host name recorded in the relays table.
    pub hostname: String,
    /// Lease TTL.
    pub ttl: Duration,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// All partitions or none (the CDC streamer of a slot): instead of a fair share, acquire
    /// every lease at once when all are free, and give all back when one is lost.
    pub exclusive: bool,
    /// Longest wait for one tick's statements; past it the tick counts as failed.
    pub answer_within: Duration,
}

/// Heartbeats, renews, acquires and sheds leases until `shutdown`; gives every lease up while
/// the relay loop is stuck (see the module docs).
pub async fn run(
    store: std::sync::Arc<dyn Store>,
    leases: std::sync::Arc<Leases>,
    settings: LeaseSettings,
    metrics: std::sync::Arc<crate::telemetry::Metrics>,
    health: std::sync::Arc<crate::health::Health>,
    shutdown: CancellationToken,
) {
    let local_validity = settings.ttl * 3 / 4;
    let mut stuck = false;
    loop {
        let silence = health.loop_silence();
        let result = if silence > health.stall_timeout() {
            if !stuck {
                tracing::error!(?silence, "the relay loop is stuck: giving up every lease");
            }
            stuck = true;
            crate::db::within(
                settings.answer_within,
                give_up(store.as_ref(), &leases, &settings),
            )
            .await
        } else {
            if stuck {
                tracing::info!("the relay loop turns again: taking part in the leases");
            }
            stuck = false;
            crate::db::within(
                settings.answer_within,
                tick(store.as_ref(), &leases, &settings, local_validity),
            )
            .await
        };
        health.lease_round(result.is_ok());
        if let Err(error) = result {
            metrics.database_errors.inc();
            tracing::warn!(%error, "lease heartbeat failed; leases lapse locally when due");
        }
        metrics.partitions_owned.set(leases.count() as i64);
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(settings.heartbeat) => {}
        }
    }
}

/// Drops every lease locally, releases them and leaves the live set.
async fn give_up(store: &dyn Store, leases: &Leases, s: &LeaseSettings) -> Result<(), sqlx::Error> {
    leases.expire_all();
    let all = leases.take_all();
    leases.changed.notify_one();
    if !all.is_empty() {
        store.release(&s.relay_id, &all).await?;
    }
    store.deregister(&s.relay_id).await
}

async fn tick(
    store: &dyn Store,
    leases: &Leases,
    s: &LeaseSettings,
    local_validity: Duration,
) -> Result<(), sqlx::Error> {
    let live = store.heartbeat(&s.relay_id, &s.hostname, s.ttl).await?;
    if s.exclusive {
        return tick_exclusive(store, leases, s, local_validity).await;
    }
    let target = fair_share(store.partitions(), &live, &s.relay_id);
    let sent = Instant::now();
    let held = leases.all();
    let still = match renew(store, s, &held).await {
        Ok(still) => still,
        Err(e) => {
            leases.expire_all();
            return Err(e);
        }
    };
    if still.len() < held.len() {
        tracing::warn!(
            lost = held.len() - still.len(),
            "partition leases lost (expired and taken over)"
        );
    }
    leases.renewed(&still, sent + local_validity);
    let keeping = leases.shed_to(target);
    if keeping < target {
        let sent = Instant::now();
        let gained = store
            .acquire(&s.relay_id, (target - keeping) as i64, s.ttl)
            .await?;
        if !gained.is_empty() {
            tracing::info!(partitions = ?gained.iter().map(|g| g.0).collect::<Vec<_>>(),
                "acquired partition leases");
        }
        leases.add(&gained, sent + local_validity);
    }
    Ok(())
}

/// Renews `held`, again at once when the database chose the renewal as a deadlock's victim
/// (or failed it as a serialization conflict): the leases are still this relay's, and letting
/// them lapse until the next tick would stop its work for nothing.
async fn renew(
    store: &dyn Store,
    s: &LeaseSettings,
    held: &[Fence],
) -> Result<Vec<i32>, sqlx::Error> {
    let mut tries = 0;
    loop {
        match store.renew(&s.relay_id, held, s.ttl).await {
            Err(e) if tries < 3 && is_conflict(&e) => {
                tries += 1;
                tracing::debug!(error = %e, "lease renewal lost a deadlock; renewing again");
            }
            result => return result,
        }
    }
}

/// A deadlock or serialization failure: the transaction was rolled back and may simply run
/// again (SQLSTATE 40001 on MySQL's deadlock 1213 and PostgreSQL's serialization failure,
/// 40P01 on PostgreSQL's deadlock).
fn is_conflict(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| matches!(&*code, "40001" | "40P01"))
}

/// The exclusive variant of [`tick`]: renew everything held, or acquire everything.
async fn tick_exclusive(
    store: &dyn Store,
    leases: &Leases,
    s: &LeaseSettings,
    local_validity: Duration,
) -> Result<(), sqlx::Error> {
    let held = leases.all();
    let sent = Instant::now();
    if !held.is_empty() {
        let still = match renew(store, s, &held).await {
            Ok(still) => still,
            Err(e) => {
                leases.expire_all();
                return Err(e);
            }
        };
        if still.len() == held.len() {
            leases.renewed(&still, sent + local_validity);
            return Ok(());
        }
        tracing::warn!(
            lost = held.len() - still.len(),
            "exclusive leases lost (expired and taken over): giving up the rest"
        );
        leases.expire_all();
        let rest = leases.take_all();
        leases.changed.notify_one();
        store.release(&s.relay_id, &rest).await?;
        return Ok(());
    }
    let gained = store.acquire_all(&s.relay_id, s.ttl).await?;
    if !gained.is_empty() {
        tracing::info!(
            partitions = gained.len(),
            "acquired every partition lease (exclusive)"
        );
        leases.add(&gained, sent + local_validity);
    }
    Ok(())
}

#[cfg(test)]
impl Leases {
    /// Test helper: holds `fences` for a minute.
    pub(crate) fn add_for_test(&self, fences: &[Fence]) {
        self.add_for_test_lasting(fences, Duration::from_secs(60));
    }

    /// Test helper: holds `fences`, valid for `validity` from now.
    pub(crate) fn add_for_test_lasting(&self, fences: &[Fence], validity: Duration) {
        self.add(fences, Instant::now() + validity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("r{i}")).collect()
    }

    #[test]
    fn fair_share_covers_every_partition_once() {
        for n in 1..10 {
            for p in [1, 7, 32, 100] {
                let live = ids(n);
                let total: usize = live.iter().map(|me| fair_share(p, &live, me)).sum();
                assert_eq!(total, p as usize, "n={n} p={p}");
            }
        }
        assert_eq!(fair_share(32, &ids(3), "r0"), 11);
        assert_eq!(fair_share(32, &ids(3), "r2"), 10);
    }

    #[test]
    fn shedding_keeps_the_lowest_and_releases_only_idle_partitions() {
        let leases = Leases::default();
        let until = Instant::now() + Duration::from_secs(60);
        leases.add(&[(1, 1), (2, 1), (3, 1), (4, 1)], until);
        assert_eq!(leases.shed_to(2), 2);
        assert_eq!(leases.usable(), vec![(1, 1), (2, 1)]);
        let busy: HashSet<i32> = [4].into();
        assert_eq!(leases.take_releasable(&busy), vec![(3, 1)]);
        assert_eq!(leases.take_releasable(&HashSet::new()), vec![(4, 1)]);
        assert_eq!(leases.count(), 2);
    }

    #[test]
    fn validity_checks_epoch_and_deadline() {
        let leases = Leases::default();
        leases.add(&[(1, 5)], Instant::now() + Duration::from_secs(60));
        assert!(leases.is_valid(1, 5));
        assert!(!leases.is_valid(1, 4));
        assert!(!leases.is_valid(2, 5));
        leases.expire_all();
        assert!(!leases.is_valid(1, 5));
        assert!(leases.usable().is_empty());
    }
}
