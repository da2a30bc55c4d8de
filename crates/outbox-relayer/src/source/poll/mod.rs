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

use std::{collections::HashSet, sync::Arc};

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
    store::{Claimed, ClaimedRow, Store},
    telemetry::Metrics,
};

mod plan;

use plan::{Batch, ClaimPlan};

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
    /// Claims and publishes until `shutdown`, then finishes the batches in flight. What to
    /// claim and when is the [`ClaimPlan`]'s; this loop runs the claims, spawns the batches
    /// and waits.
    pub(crate) async fn run(
        self: &Arc<Self>,
        wake: &tokio::sync::Notify,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        // A JoinSet aborts its tasks when dropped: an aborted relay leaves nothing running.
        let mut inflight = tokio::task::JoinSet::new();
        let mut plan = ClaimPlan::new(&self.config, Instant::now());
        loop {
            self.health.loop_turned();
            self.release_surplus(plan.busy()).await;
            let stopping = shutdown.is_cancelled();
            if stopping && inflight.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if !stopping && plan.ready(now, inflight.len()) {
                let Some(claim) = plan.next_claim(self.leases.usable(), now) else {
                    if plan.busy().is_empty() {
                        // No partition to claim from: not waiting for a claim.
                        self.health.claim_done();
                    }
                    continue;
                };
                self.health.claim_started();
                let started = Instant::now();
                let claimed = within(
                    self.completer.answer_within,
                    self.store.claim(
                        &claim.partitions,
                        claim.batch_size,
                        self.max_payload,
                        claim.byte_room,
                    ),
                )
                .await;
                match claimed {
                    Ok(Claimed { rows, cut }) => {
                        self.health.database_ok();
                        self.health.claim_done();
                        let Some(batch) = plan.claimed(claim, &rows, cut, started) else {
                            continue;
                        };
                        self.health.saw_work();
                        self.metrics.batch_size.observe(rows.len() as f64);
                        self.metrics.inflight_bytes.set(plan.inflight_bytes());
                        inflight.spawn(self.clone().batch(rows, batch));
                    }
                    Err(error) => {
                        self.metrics.database_errors.inc();
                        let delay = plan.claim_failed(Instant::now());
                        tracing::warn!(%error, ?delay, "claim failed; retrying");
                    }
                }
                continue;
            }
            // Here either there is nothing to claim (wait for a wake-up or the poll), or the
            // publisher is paused (wait out the pause), or every batch slot is taken: then only
            // a finished batch frees one, and the timer is a mere fallback. (It was the pause,
            // zero, which made the loop spin while the batches published; the simulation
            // found it.)
            let idle = plan.wait(now, inflight.len());
            tokio::select! {
                biased;
                Some(done) = inflight.join_next(), if !inflight.is_empty() => {
                    let done: BatchDone = done.expect("batch task panicked");
                    let pause = plan.batch_done(&done.partitions, done.bytes, &done.tally, Instant::now());
                    self.metrics.inflight_bytes.set(plan.inflight_bytes());
                    if done.tally.published > 0 || done.tally.dead > 0 {
                        self.health.progressed();
                    }
                    if let Some(delay) = pause {
                        tracing::warn!(?delay, "broker failing; pausing the publisher");
                    }
                }
                () = wake.notified(), if !stopping => plan.wake(),
                () = self.leases.changed(), if !stopping => plan.wake(),
                () = tokio::time::sleep(idle), if !stopping => plan.wake(),
                () = shutdown.cancelled(), if !stopping => {
                    tracing::info!(inflight = inflight.len(), "shutting down: finishing batches in flight");
                }
            }
        }
    }

    /// Hands back the partitions the lease balancer asks this relay to give up, among those
    /// without a batch in flight (`busy`).
    async fn release_surplus(&self, busy: &HashSet<i32>) {
        let releasable = self.leases.take_releasable(busy);
        if releasable.is_empty() {
            return;
        }
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

    /// Publishes one claimed batch (of `bytes` in memory) and records the outcomes.
    async fn batch(self: Arc<Self>, rows: Vec<ClaimedRow>, batch: Batch) -> BatchDone {
        let Batch { fences, bytes } = batch;
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

/// A batch finished: its partitions are free again, its bytes back in the budget.
#[derive(Debug)]
struct BatchDone {
    partitions: Vec<i32>,
    /// Bytes the batch held in memory, given back to the budget.
    bytes: i64,
    tally: Tally,
}
