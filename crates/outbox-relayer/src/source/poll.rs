//! The polling source: claims the pending rows of the partitions this relay leases and hands
//! each batch to dispatch and completion, with up to `max_inflight_batches` batches in flight
//! over disjoint partitions. The batch size adapts to the backlog; a full claim is followed at
//! once by the next, a claim that came back less than full only `claim_linger` after it (so
//! that a moderate write rate is claimed a few milliseconds at a time, not one statement pair
//! per commit); an idle relay waits for a NOTIFY, a finished batch, a lease change or the poll
//! interval, which is `claim_linger` right after a claim that found events and doubles up to
//! `poll_interval` while claims come back empty (writers that do not NOTIFY still see their
//! events published within milliseconds while events flow). Each partition's scan starts at a
//! floor (a hint, see `postgres/sql/claim.sql`), reset every `rescan_interval` and whenever a
//! claim comes back less than full. The rows in flight are bounded in number and in bytes
//! (`max_inflight_bytes`).

use std::{collections::HashSet, sync::Arc, time::Duration};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    complete::{Completer, Tally},
    config::RelayConfig,
    db::within,
    dispatch,
    error::Error,
    health::Health,
    lease::Leases,
    publisher::Publisher,
    retry::{jittered, Backoff},
    store::{Claimed, ClaimedRow, Fence, Store},
    telemetry::Metrics,
};

/// The polling source of one relay.
pub(crate) struct Poll {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) publisher: Arc<dyn Publisher>,
    pub(crate) config: RelayConfig,
    pub(crate) relay_id: String,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) health: Arc<Health>,
    pub(crate) leases: Arc<Leases>,
    pub(crate) completer: Arc<Completer>,
    /// Largest payload published.
    pub(crate) max_payload: usize,
}

impl Poll {
    /// Claims and publishes until `shutdown`, then finishes the batches in flight.
    pub(crate) async fn run(
        self: &Arc<Self>,
        wake: &tokio::sync::Notify,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let max_payload = self.max_payload;
        // A JoinSet aborts its tasks when dropped: an aborted relay leaves nothing running.
        let mut inflight = tokio::task::JoinSet::new();
        let mut busy: HashSet<i32> = HashSet::new();
        let mut batch_size = self.config.min_batch_size;
        let mut rotation = 0usize;
        // Per-partition scan floors (see `postgres/sql/claim.sql`), cleared every `rescan_interval`.
        let mut floors: std::collections::HashMap<i32, i64> = std::collections::HashMap::new();
        let mut full_scan_at = Instant::now();
        let mut more = true;
        let mut paused_until = Instant::now();
        let mut circuit = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        let mut db_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        // Bytes of claimed rows in the batches in flight, against `max_inflight_bytes`.
        let budget = i64::try_from(self.config.max_inflight_bytes).unwrap_or(i64::MAX);
        let mut inflight_bytes: i64 = 0;
        // How long an idle relay waits for a wake-up before it claims again: right after a claim
        // that found events, `claim_linger` (more are likely on their way, from writers that
        // may not NOTIFY), doubling while claims come back empty, up to `poll_interval`.
        let eager_poll = self.config.claim_linger.max(MIN_POLL);
        let mut idle_poll = self.config.poll_interval;
        // No claim before this, unless the last one came back full (see `claim_linger`).
        let mut linger_until = Instant::now();
        loop {
            self.health.loop_turned();
            let releasable = self.leases.take_releasable(&busy);
            if !releasable.is_empty() {
                tracing::info!(partitions = ?releasable.iter().map(|f| f.0).collect::<Vec<_>>(),
                    "releasing partitions for rebalancing");
                let released = within(
                    self.completer.answer_within,
                    self.store.release(&self.relay_id, &releasable),
                );
                if let Err(error) = released.await {
                    tracing::warn!(%error, "release failed; the leases will expire instead");
                }
            }
            let stopping = shutdown.is_cancelled();
            if stopping && inflight.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if !stopping
                && more
                && now >= paused_until
                && now >= linger_until
                && inflight.len() < self.config.max_inflight_batches
                && inflight_bytes < budget
            {
                let mut free: Vec<Fence> = self
                    .leases
                    .usable()
                    .into_iter()
                    .filter(|(p, _)| !busy.contains(p))
                    .collect();
                if free.is_empty() {
                    if busy.is_empty() {
                        // No partition to claim from: not waiting for a claim.
                        self.health.claim_done();
                    }
                    more = false;
                    continue;
                }
                rotation = rotation.wrapping_add(1);
                let shift = rotation % free.len();
                free.rotate_left(shift);
                if full_scan_at.elapsed() >= self.config.rescan_interval {
                    floors.clear();
                    full_scan_at = Instant::now();
                }
                let partitions: Vec<(i32, i64)> = free
                    .iter()
                    .map(|f| (f.0, floors.get(&f.0).copied().unwrap_or(0)))
                    .collect();
                self.health.claim_started();
                let claim_started = Instant::now();
                let claimed = within(
                    self.completer.answer_within,
                    self.store.claim(
                        &partitions,
                        batch_size,
                        max_payload,
                        budget - inflight_bytes,
                    ),
                )
                .await;
                match claimed {
                    Ok(Claimed { rows, cut }) => {
                        db_backoff.reset();
                        self.health.database_ok();
                        self.health.claim_done();
                        // Cut by the byte budget: more is waiting, whatever the row count.
                        let full = rows.len() as i64 >= batch_size || cut;
                        if !cut {
                            batch_size = adapt(batch_size, rows.len(), &self.config);
                        }
                        more = full;
                        linger_until = if full {
                            claim_started
                        } else {
                            claim_started + self.config.claim_linger
                        };
                        if !full {
                            // Keeping up: the next claim scans from the start, so a row that
                            // committed after later ones is found at once. Floors only pay
                            // while a backlog keeps claims full.
                            floors.clear();
                        }
                        idle_poll = if rows.is_empty() {
                            (idle_poll * 2).min(self.config.poll_interval)
                        } else {
                            eager_poll.min(self.config.poll_interval)
                        };
                        if rows.is_empty() {
                            continue;
                        }
                        self.health.saw_work();
                        self.metrics.batch_size.observe(rows.len() as f64);
                        // The new floor of each partition read: the lowest id found pending there.
                        let mut lowest: std::collections::HashMap<i32, i64> =
                            std::collections::HashMap::new();
                        for row in &rows {
                            let id = lowest.entry(row.partition).or_insert(row.id);
                            *id = (*id).min(row.id);
                        }
                        if full {
                            floors.extend(lowest);
                        }
                        let taken: HashSet<i32> = rows.iter().map(|r| r.partition).collect();
                        busy.extend(&taken);
                        let fences: Vec<Fence> = free
                            .into_iter()
                            .filter(|(p, _)| taken.contains(p))
                            .collect();
                        let bytes: i64 = rows.iter().map(|r| r.row_bytes.max(0)).sum();
                        inflight_bytes += bytes;
                        self.metrics.inflight_bytes.set(inflight_bytes);
                        inflight.spawn(self.clone().batch(rows, fences, bytes));
                    }
                    Err(error) => {
                        self.metrics.database_errors.inc();
                        let delay = jittered(&mut db_backoff);
                        tracing::warn!(%error, ?delay, "claim failed; retrying");
                        paused_until = Instant::now() + delay;
                    }
                }
                continue;
            }
            // Here either there is nothing to claim (wait for a wake-up or the poll), or the
            // publisher is paused (wait out the pause), or every batch slot is taken: then only
            // a finished batch frees one, and the timer is a mere fallback. (It was the pause,
            // zero, which made the loop spin while the batches published; the simulation
            // found it.)
            let pause = paused_until
                .max(linger_until)
                .saturating_duration_since(now);
            let full =
                inflight.len() >= self.config.max_inflight_batches || inflight_bytes >= budget;
            let idle = if more && !full {
                pause
            } else if full {
                self.config.poll_interval
            } else {
                idle_poll
            };
            tokio::select! {
                biased;
                Some(done) = inflight.join_next(), if !inflight.is_empty() => {
                    let done: BatchDone = done.expect("batch task panicked");
                    for p in &done.partitions {
                        busy.remove(p);
                    }
                    inflight_bytes -= done.bytes;
                    self.metrics.inflight_bytes.set(inflight_bytes);
                    more = true;
                    if done.tally.published > 0 || done.tally.dead > 0 {
                        self.health.progressed();
                    }
                    if done.tally.transient > 0 && done.tally.published == 0 {
                        let delay = jittered(&mut circuit);
                        tracing::warn!(?delay, "broker failing; pausing the publisher");
                        paused_until = Instant::now() + delay;
                    } else if done.tally.published > 0 {
                        circuit.reset();
                    }
                }
                () = wake.notified(), if !stopping => more = true,
                () = self.leases.changed(), if !stopping => more = true,
                () = tokio::time::sleep(idle), if !stopping => more = true,
                () = shutdown.cancelled(), if !stopping => {
                    tracing::info!(inflight = inflight.len(), "shutting down: finishing batches in flight");
                }
            }
        }
    }

    /// Publishes one claimed batch (of `bytes` in memory) and records the outcomes.
    async fn batch(
        self: Arc<Self>,
        rows: Vec<ClaimedRow>,
        fences: Vec<Fence>,
        bytes: i64,
    ) -> BatchDone {
        let epoch_of = |p: i32| fences.iter().find(|f| f.0 == p).map_or(-1, |f| f.1);
        let items: Vec<dispatch::Item> = rows
            .into_iter()
            .map(|row| {
                let (id, epoch) = (row.id, epoch_of(row.partition));
                dispatch::item(row, id, epoch, &self.config.routing, self.max_payload)
            })
            .collect();
        let results = dispatch::dispatch(
            items,
            self.publisher.clone(),
            self.leases.clone(),
            self.config.lane_concurrency,
            self.config.publish_timeout,
        )
        .await;
        let tally = self.completer.complete(&results, &fences).await;
        BatchDone {
            partitions: fences.iter().map(|f| f.0).collect(),
            bytes,
            tally,
        }
    }
}

/// The shortest wait for more events after a claim that found some (see `idle_poll` in
/// [`Poll::run`]), when `claim_linger` is 0.
const MIN_POLL: Duration = Duration::from_millis(1);

/// A batch finished: its partitions are free again, its bytes back in the budget.
#[derive(Debug)]
struct BatchDone {
    partitions: Vec<i32>,
    /// Bytes the batch held in memory, given back to the budget.
    bytes: i64,
    tally: Tally,
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
mod tests {
    use super::*;

    #[test]
    fn batch_size_adapts_to_the_backlog() {
        let c = RelayConfig::default();
        assert_eq!(adapt(50, 50, &c), 100);
        assert_eq!(adapt(800, 800, &c), 1000);
        assert_eq!(adapt(1000, 100, &c), 500);
        assert_eq!(adapt(100, 60, &c), 100);
        assert_eq!(adapt(50, 0, &c), 50);
    }
}
