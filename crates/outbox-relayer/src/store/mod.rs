//! The relay's access to its outbox: the [`Store`] trait every database implements (in its
//! own folder: `postgres/`, `mysql/`, `sqlite/`), and what it returns.

mod rows;

use std::time::Duration;

use futures::future::BoxFuture;

pub use rows::{storable_error, Claimed, ClaimedRow, Failure, MAX_ERROR_TEXT};

/// A lease held by this relay: partition and the epoch it was acquired with.
pub type Fence = (i32, i64);

/// Which source records a publish with [`Store::mark_published`]: how the mark treats the
/// holds whose head event it marks, and which ids it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marking {
    /// A claimed batch (polling): a hold whose head is marked is released, and the rows
    /// waiting behind it are set free (the claim reads every pending row, in id order).
    /// Returns the ids marked.
    Claimed,
    /// Streamed events (CDC): holds stay; the CDC table path gives an aggregate back to the
    /// stream once nothing of it is pending (the stream reads no table: a hold released at its
    /// head would strand the rows behind it). Returns the ids marked and, on stores with a CDC
    /// source, the ids no longer pending (marked before): an id not returned is not visible
    /// yet, or the leases are gone.
    Streamed,
}

/// Backlog figures for the lag gauges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Backlog {
    /// Events waiting to be published.
    pub pending: i64,
    /// How long the oldest of them has waited since it was written, by the database clock
    /// (its `enqueued_at`, never the writer's `occurred_at`).
    pub oldest_age: Option<Duration>,
    /// Dead-lettered events.
    pub dead: i64,
}

/// A wait the database measured in microseconds, as a duration: a negative one (a row whose
/// arrival time a writer set ahead, against the contract) reads as no wait.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn waited(micros: i64) -> Duration {
    Duration::from_micros(micros.max(0) as u64)
}

/// One partition as `outbox status` shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PartitionStatus {
    /// Partition number.
    pub partition: i32,
    /// Relay holding the lease, if any.
    pub owner: Option<String>,
    /// Fencing epoch (takeovers so far).
    pub epoch: i64,
    /// Whether the lease is unexpired.
    pub live: bool,
    /// Pending events in the partition.
    pub pending: i64,
    /// Age of its oldest pending event, in seconds.
    pub oldest_age_seconds: Option<f64>,
}

/// What the relay needs from a database. Internal seam between the relay and its storage
/// backends (PostgreSQL, SQLite): not a stable API for applications, which use the write side
/// in the `outbox` crate. Every method is one short statement or transaction; every write of
/// event state is fenced by the lease epochs given.
pub trait Store: Send + Sync + 'static {
    /// Partition count.
    fn partitions(&self) -> i32;
    /// Records the relay as alive; returns the live relay ids, sorted.
    fn heartbeat<'a>(
        &'a self,
        relay_id: &'a str,
        hostname: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<String>, sqlx::Error>>;
    /// Removes the relay from the live set.
    fn deregister<'a>(&'a self, relay_id: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    /// Extends `held`; returns the partitions still held.
    fn renew<'a>(
        &'a self,
        relay_id: &'a str,
        held: &'a [Fence],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<i32>, sqlx::Error>>;
    /// Takes up to `n` free or expired partitions, bumping their epoch.
    fn acquire<'a>(
        &'a self,
        relay_id: &'a str,
        n: i64,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Fence>, sqlx::Error>>;
    /// Takes every partition lease at once if all are free or expired (bumping each epoch),
    /// or none. Stores without CDC support take none.
    fn acquire_all<'a>(
        &'a self,
        relay_id: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Fence>, sqlx::Error>> {
        let _ = (relay_id, ttl);
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Gives leases back.
    fn release<'a>(
        &'a self,
        relay_id: &'a str,
        leases: &'a [Fence],
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    /// Pending rows of `partitions` (visited in order), each scanned from its floor id (a
    /// hint; see `postgres/sql/claim.sql`), skipping held aggregates: at most `limit` rows, and while
    /// their `row_bytes` stay within `byte_budget` (the first row always).
    fn claim<'a>(
        &'a self,
        partitions: &'a [(i32, i64)],
        limit: i64,
        max_payload_bytes: usize,
        byte_budget: i64,
    ) -> BoxFuture<'a, Result<Claimed, sqlx::Error>>;
    /// Marks acknowledged events published, if this relay still holds their leases; returns
    /// the ids settled (see [`Marking`]).
    fn mark_published<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        ids: &'a [i64],
        marking: Marking,
    ) -> BoxFuture<'a, Result<Vec<i64>, sqlx::Error>>;
    /// Records failed attempts; returns how many were recorded.
    fn mark_failed<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        failures: &'a [Failure],
        park_on_dead: bool,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>>;
    /// Pending count, oldest pending age, dead count.
    fn backlog(&self) -> BoxFuture<'_, Result<Backlog, sqlx::Error>>;
    /// Every partition with its lease owner and backlog, for `outbox status` and the
    /// dashboard. Stores without leases to show (the simulation's model) list none.
    fn partition_status(&self) -> BoxFuture<'_, Result<Vec<PartitionStatus>, sqlx::Error>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Sets free the rows waiting behind a hold that is gone (see `postgres/sql/waiting.sql`); returns
    /// how many. Stores without waiting rows do nothing.
    fn release_stale(&self) -> BoxFuture<'_, Result<u64, sqlx::Error>> {
        Box::pin(async { Ok(0) })
    }
    /// Keeps planner statistics fresh where the database needs it; returns whether it acted.
    fn refresh_statistics(&self) -> BoxFuture<'_, Result<bool, sqlx::Error>> {
        Box::pin(async { Ok(false) })
    }
    /// A task that calls `wake` when new events are committed, if the database can say so.
    fn notifications(
        &self,
        wake: std::sync::Arc<tokio::sync::Notify>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Option<BoxFuture<'static, ()>> {
        let _ = (wake, shutdown);
        None
    }
}
