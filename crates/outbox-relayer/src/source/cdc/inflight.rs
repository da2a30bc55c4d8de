//! The batches in flight, in stream order (see `pipeline.rs`, which publishes and settles them).

use std::{
    collections::{HashSet, VecDeque},
    hash::{DefaultHasher, Hash, Hasher},
};

use pgwire_replication::Lsn;
use tokio::task::{JoinError, JoinHandle};

use super::context::{Key, Streamed};
use crate::dispatch::Outcome;

/// Each dispatched event with its routed destination and its outcome.
pub(super) type Results = Vec<(Streamed, String, Outcome)>;

/// A batch being published.
pub(super) struct Batch {
    pub(super) task: JoinHandle<Results>,
    /// The task's output, once awaited by [`InFlight::front_done`].
    pub(super) done: Option<Result<Results, JoinError>>,
    /// The hashes of its aggregates' keys ([`key_hash`]).
    pub(super) keys: HashSet<u64>,
    /// Position confirmed once this batch and every earlier one are settled.
    pub(super) end: Option<Lsn>,
}

/// The batches in flight, in stream order.
#[derive(Default)]
pub(super) struct InFlight {
    pub(super) queue: VecDeque<Batch>,
}

impl InFlight {
    /// Whether no batch is in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Waits until the oldest batch is published (a branch of the stream's idle wait).
    pub(super) async fn front_done(&mut self) {
        if let Some(batch) = self.queue.front_mut() {
            if batch.done.is_none() {
                batch.done = Some((&mut batch.task).await);
            }
        }
    }

    pub(super) fn front_ready(&self) -> bool {
        self.queue
            .front()
            .is_some_and(|b| b.done.is_some() || b.task.is_finished())
    }

    /// Whether a batch in flight may share an aggregate with `keys` (hashes: two aggregates
    /// with one hash only make the new batch wait for the older one, never publish at once).
    pub(super) fn overlaps(&self, keys: &HashSet<u64>) -> bool {
        self.queue.iter().any(|b| !b.keys.is_disjoint(keys))
    }

    /// Whether a batch in flight may hold an event of `key` (see [`InFlight::overlaps`]).
    pub(super) fn may_hold(&self, key: &Key) -> bool {
        if self.queue.is_empty() {
            return false;
        }
        let hash = hash_of(&key.0, &key.1);
        self.queue.iter().any(|b| b.keys.contains(&hash))
    }
}

impl Drop for InFlight {
    /// A session that ends stops its batches: the next one streams their transactions again
    /// (unconfirmed) and publishes them itself, rather than beside a batch of the old one.
    fn drop(&mut self) {
        for batch in &self.queue {
            batch.task.abort();
        }
    }
}

pub(super) fn key_of(e: &Streamed) -> Key {
    (e.row.aggregate_type.clone(), e.row.aggregate_id.clone())
}

/// A hash of the event's aggregate key, for [`Batch::keys`]: a batch in flight keeps a number
/// per event rather than a copy of its two key strings.
pub(super) fn key_hash(e: &Streamed) -> u64 {
    hash_of(&e.row.aggregate_type, &e.row.aggregate_id)
}

fn hash_of(aggregate_type: &str, aggregate_id: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    (aggregate_type, aggregate_id).hash(&mut hasher);
    hasher.finish()
}
