//! Marking published rows off the stream's critical path. The stream loop hands the ids of a
//! batch's published table rows to a task and goes on with the next batch; the slot position
//! of a transaction is confirmed only once every mark before it (in stream order) is written.
//! A row whose commit reached the stream before it became visible is marked again shortly
//! after, without holding up the stream.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use pgwire_replication::Lsn;
use tokio::task::JoinHandle;

use super::source::{retry, Context, End, Sql};
use crate::store::Fence;

/// How many batches' marks may be in flight before the stream waits for the oldest.
const MAX_IN_FLIGHT: usize = 8;

/// A task writing one batch's marks.
pub(super) type MarkTask = JoinHandle<Result<(), End>>;

/// Marks in flight, in stream order, each with the position it lets the slot confirm.
#[derive(Default)]
pub(super) struct Marks {
    queue: VecDeque<(Option<MarkTask>, Option<Lsn>)>,
    confirm: Option<Lsn>,
}

impl Marks {
    /// Whether nothing is in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues a mark task (if any) and the position confirmed once it and all earlier ones
    /// are written.
    pub(super) fn push(&mut self, task: Option<MarkTask>, lsn: Option<Lsn>) {
        if task.is_some() || lsn.is_some() {
            self.queue.push_back((task, lsn));
        }
    }

    /// Collects finished marks from the front (all of them with `wait_all`, or while more
    /// than [`MAX_IN_FLIGHT`] are queued); the first failure ends the session.
    pub(super) async fn reap(&mut self, wait_all: bool) -> Result<(), End> {
        while let Some((task, _)) = self.queue.front_mut() {
            let ready = task.as_ref().is_none_or(|t| t.is_finished());
            if !(ready || wait_all || self.queue.len() > MAX_IN_FLIGHT) {
                break;
            }
            let (task, lsn) = self.queue.pop_front().expect("front exists");
            if let Some(task) = task {
                task.await
                    .map_err(|e| End::Failed(format!("mark task: {e}")))??;
            }
            if lsn.is_some() {
                self.confirm = lsn;
            }
        }
        Ok(())
    }

    /// The newest position every earlier mark allows to confirm, once.
    pub(super) fn take_confirm(&mut self) -> Option<Lsn> {
        self.confirm.take()
    }
}

/// Marks `ids` published in a task of their own (`None` when there is nothing to mark).
pub(super) fn spawn_mark(
    ctx: Arc<Context>,
    sql: Arc<Sql>,
    fences: Vec<Fence>,
    ids: Vec<i64>,
) -> Option<MarkTask> {
    (!ids.is_empty()).then(|| tokio::spawn(mark(ctx, sql, fences, ids)))
}

async fn mark(
    ctx: Arc<Context>,
    sql: Arc<Sql>,
    fences: Vec<Fence>,
    ids: Vec<i64>,
) -> Result<(), End> {
    let mut ids: std::collections::BTreeSet<i64> = ids.into_iter().collect();
    let (parts, epochs): (Vec<i32>, Vec<i64>) = fences.iter().copied().unzip();
    let mut tries = 0;
    while !ids.is_empty() {
        let list: Vec<i64> = ids.iter().copied().collect();
        let marked: Vec<i64> = retry(&ctx, &fences, || {
            sqlx::query_scalar(&sql.mark_published)
                .bind(list.clone())
                .bind(parts.clone())
                .bind(epochs.clone())
                .bind(&ctx.relay_id)
                .fetch_all(&ctx.pool)
        })
        .await?;
        for id in marked {
            ids.remove(&id);
        }
        if ids.is_empty() {
            break;
        }
        if !fences.iter().all(|(p, e)| ctx.leases.is_valid(*p, *e)) {
            return Err(End::LeaseLost);
        }
        tries += 1;
        if tries > 20 {
            tracing::warn!(
                rows = ids.len(),
                "published rows not found pending in the table (deleted by another \
                 transaction?): left as they are"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(5 * tries)).await;
    }
    Ok(())
}
