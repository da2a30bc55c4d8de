//! Marking published rows off the stream's critical path. The stream loop hands the ids of a
//! batch's published table rows over and goes on with the next batch; one statement marks them
//! in a task of its own, and ids published meanwhile are marked together by the next one. The
//! slot position of a transaction is confirmed only once every id before it (in stream order)
//! is marked.
//! A row whose commit reached the stream before it became visible (a commit waiting for a
//! synchronous standby) is marked again until its transaction is visible, however long that
//! takes, without holding up the stream; only its position waits.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use pgwire_replication::Lsn;
use tokio::task::JoinHandle;

use super::context::{retry, Context, End};
use crate::store::{Fence, Marking};

/// How many published ids may wait for the running mark before the stream waits for it.
const MAX_WAITING: usize = 100_000;

/// A task writing marks.
type MarkTask = JoinHandle<Result<(), End>>;

/// Marks of published rows: one statement in flight at a time; ids published meanwhile wait
/// and are written together by the next one (a busy stream writes few, large marks rather than
/// one per batch). A position is confirmed only once every id published before it is marked.
pub(super) struct Marks {
    ctx: Arc<Context>,
    fences: Vec<Fence>,
    /// The mark being written, with the position it lets the slot confirm.
    running: Option<(MarkTask, Option<Lsn>)>,
    /// Ids published since the running mark started, with their transactions.
    waiting: Vec<(i64, u32)>,
    /// Position confirmed once `waiting` is written.
    waiting_lsn: Option<Lsn>,
    /// A mark that failed (ends the session at the next [`Marks::reap`]).
    failed: Option<End>,
    confirm: Option<Lsn>,
}

impl Marks {
    /// No marks yet, for a session holding `fences`.
    pub(super) fn new(ctx: Arc<Context>, fences: Vec<Fence>) -> Self {
        Self {
            ctx,
            fences,
            running: None,
            waiting: Vec::new(),
            waiting_lsn: None,
            failed: None,
            confirm: None,
        }
    }

    /// Whether nothing is being written or waits to be.
    pub(super) fn is_empty(&self) -> bool {
        self.running.is_none() && self.waiting.is_empty() && self.waiting_lsn.is_none()
    }

    /// Whether a mark is being written.
    pub(super) fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Published rows to mark, with their transactions (0: visible already).
    pub(super) fn add(&mut self, ids: impl IntoIterator<Item = (i64, u32)>) {
        self.waiting.extend(ids);
    }

    /// A position to confirm once every id added before it is marked.
    pub(super) fn confirm_after(&mut self, lsn: Lsn) {
        if self.running.is_none() && self.waiting.is_empty() {
            self.confirm = Some(lsn);
        } else {
            self.waiting_lsn = Some(lsn);
        }
    }

    /// Waits for the running mark (a branch of the stream's idle wait: the next one starts,
    /// and positions are confirmed, without waiting for the stream).
    pub(super) async fn running_done(&mut self) {
        if let Some((task, lsn)) = self.running.as_mut() {
            let result = task.await;
            let lsn = *lsn;
            self.running = None;
            self.settle(result, lsn);
        }
    }

    fn settle(
        &mut self,
        result: Result<Result<(), End>, tokio::task::JoinError>,
        lsn: Option<Lsn>,
    ) {
        match result {
            Ok(Ok(())) => {
                if lsn.is_some() {
                    self.confirm = lsn;
                }
            }
            Ok(Err(end)) => self.failed = Some(end),
            Err(e) => self.failed = Some(End::failed("mark task", e)),
        }
    }

    /// Collects a finished mark and starts the next one; with `wait_all` (or too many ids
    /// waiting), until everything is written. The first failure ends the session.
    pub(super) async fn reap(&mut self, wait_all: bool) -> Result<(), End> {
        loop {
            if let Some(end) = self.failed.take() {
                return Err(end);
            }
            if let Some((task, _)) = &self.running {
                if !(task.is_finished() || wait_all || self.waiting.len() > MAX_WAITING) {
                    return Ok(());
                }
                self.running_done().await;
                continue;
            }
            if !self.waiting.is_empty() {
                let ids = std::mem::take(&mut self.waiting);
                let task = tokio::spawn(mark(self.ctx.clone(), self.fences.clone(), ids));
                self.running = Some((task, self.waiting_lsn.take()));
                if wait_all {
                    continue;
                }
                return Ok(());
            }
            if let Some(lsn) = self.waiting_lsn.take() {
                self.confirm = Some(lsn);
            }
            return Ok(());
        }
    }

    /// The newest position every earlier mark allows to confirm, once.
    pub(super) fn take_confirm(&mut self) -> Option<Lsn> {
        self.confirm.take()
    }
}

/// Ids per mark statement: each is its own short transaction, so the lease rows it locks
/// (`FOR SHARE`) are never held long against their renewal.
const MARK_CHUNK: usize = 5_000;

async fn mark(ctx: Arc<Context>, fences: Vec<Fence>, mut rows: Vec<(i64, u32)>) -> Result<(), End> {
    rows.sort_unstable();
    for chunk in rows.chunks(MARK_CHUNK) {
        mark_chunk(&ctx, &fences, chunk).await?;
    }
    Ok(())
}

/// Marks `rows` until each is settled. A row not settled is not visible yet, or gone: while
/// its transaction is not visible to queries, it is marked again (however long); once it is,
/// a row still not found was deleted meanwhile, and is left as it is.
async fn mark_chunk(ctx: &Context, fences: &[Fence], rows: &[(i64, u32)]) -> Result<(), End> {
    let mut left: BTreeMap<i64, u32> = rows.iter().copied().collect();
    let mut tries = 0u64;
    let mut seen_visible = false;
    while !left.is_empty() {
        let list: Vec<i64> = left.keys().copied().collect();
        let settled: Vec<i64> = retry(ctx, fences, || {
            ctx.store
                .mark_published(&ctx.relay_id, fences, &list, Marking::Streamed)
        })
        .await?;
        for id in settled {
            left.remove(&id);
        }
        if left.is_empty() {
            break;
        }
        if !fences.iter().all(|(p, e)| ctx.leases.is_valid(*p, *e)) {
            return Err(End::LeaseLost);
        }
        tries += 1;
        if tries >= 5 {
            let mut xids: Vec<i64> = left
                .values()
                .filter(|x| **x != 0)
                .map(|x| i64::from(*x))
                .collect();
            xids.sort_unstable();
            xids.dedup();
            let invisible: i64 = if xids.is_empty() {
                0
            } else {
                retry(ctx, fences, || ctx.db.invisible(&xids)).await?
            };
            if invisible == 0 {
                // One more mark after the transactions are known visible, then give up.
                if seen_visible {
                    tracing::warn!(
                        rows = left.len(),
                        "published rows not found in the table although their transactions \
                         are visible (deleted by another transaction?): left as they are"
                    );
                    break;
                }
                seen_visible = true;
                continue;
            }
        }
        tokio::time::sleep(Duration::from_millis((5 * tries).min(250))).await;
    }
    Ok(())
}

impl Drop for Marks {
    /// A session that ends stops its mark: the next session streams the unconfirmed
    /// transactions again and marks their rows itself.
    fn drop(&mut self) {
        if let Some((task, _)) = &self.running {
            task.abort();
        }
    }
}
