//! Held aggregates being published from the table, off the stream's critical path: the stream
//! loop reads a due aggregate's pending rows, hands them to the dispatcher in a task of its
//! own, and goes on streaming; it records the outcomes when the task is done (see
//! `table_path.rs`). An aggregate whose destination hangs thus holds up no other one. An
//! aggregate is in one resumption at a time, and stays held until its resumption is recorded:
//! what the stream carries of it meanwhile goes to the table behind it.

use std::collections::HashSet;

use tokio::task::{JoinError, JoinHandle};

use super::{context::Key, inflight::Results};
use crate::store::ClaimedRow;

/// Aggregates published from the table by one task.
pub(super) struct Resumption {
    /// The aggregates.
    keys: Vec<Key>,
    /// Their pending rows, as read, in id order per aggregate.
    rows: Vec<ClaimedRow>,
    task: JoinHandle<Results>,
    /// The task's output, once awaited by [`Resumptions::any_done`].
    done: Option<Result<Results, JoinError>>,
}

impl Resumption {
    /// Its aggregates, the rows it read and the outcomes of their publishes.
    pub(super) async fn outcome(self) -> (Vec<Key>, Vec<ClaimedRow>, Result<Results, JoinError>) {
        let results = match self.done {
            Some(done) => done,
            None => self.task.await,
        };
        (self.keys, self.rows, results)
    }
}

/// The resumptions under way.
#[derive(Default)]
pub(super) struct Resumptions {
    jobs: Vec<Resumption>,
    busy: HashSet<Key>,
}

impl Resumptions {
    /// Whether none is under way.
    pub(super) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Whether `key` is being published from the table.
    pub(super) fn busy(&self, key: &Key) -> bool {
        self.busy.contains(key)
    }

    /// One more, publishing `rows` of `keys` in `task`.
    pub(super) fn start(
        &mut self,
        keys: Vec<Key>,
        rows: Vec<ClaimedRow>,
        task: JoinHandle<Results>,
    ) {
        self.busy.extend(keys.iter().cloned());
        self.jobs.push(Resumption {
            keys,
            rows,
            task,
            done: None,
        });
    }

    /// Waits until one of them is published (a branch of the stream's idle wait).
    pub(super) async fn any_done(&mut self) {
        if self.jobs.iter().any(|j| j.done.is_some()) {
            return;
        }
        if self.jobs.is_empty() {
            return std::future::pending().await;
        }
        let waiting = self.jobs.iter_mut().map(|j| &mut j.task);
        let (done, index, _) = futures::future::select_all(waiting).await;
        self.jobs[index].done = Some(done);
    }

    /// The resumptions whose publishes are done, in the order they were started; their
    /// aggregates are no longer busy.
    pub(super) fn take_done(&mut self) -> Vec<Resumption> {
        self.take(|j| j.done.is_some() || j.task.is_finished())
    }

    /// Every resumption, done or not (the caller waits for their outcomes).
    pub(super) fn take_all(&mut self) -> Vec<Resumption> {
        self.take(|_| true)
    }

    fn take(&mut self, which: impl Fn(&Resumption) -> bool) -> Vec<Resumption> {
        let (done, running): (Vec<Resumption>, Vec<Resumption>) =
            std::mem::take(&mut self.jobs).into_iter().partition(which);
        self.jobs = running;
        for job in &done {
            for key in &job.keys {
                self.busy.remove(key);
            }
        }
        done
    }
}

impl Drop for Resumptions {
    /// A session that ends stops its resumptions: their rows stay pending in the table, under
    /// their holds, and the next session publishes them again (at least once, in order).
    fn drop(&mut self) {
        for job in &self.jobs {
            job.task.abort();
        }
    }
}
