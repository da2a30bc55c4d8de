//! The CDC source's database as a seam: the statements it runs beside the [`Store`] (those of
//! `postgres/sql/cdc.sql`) and its replication stream. PostgreSQL implements it
//! (`crate::postgres::PgCdc`); the deterministic simulation (`outbox-sim`) implements it over
//! its model, so that the same CDC engine runs under both.
//!
//! Every write of event state is fenced: it takes effect only while `relay_id` holds each of
//! `fences` (partition, epoch), and says when it did not.
//!
//! [`Store`]: crate::store::Store

use std::time::Duration;

use futures::future::BoxFuture;
pub use pgwire_replication::{Lsn, ReplicationEvent};

use crate::store::{ClaimedRow, Fence};

/// Any error of the replication stream.
pub type StreamError = Box<dyn std::error::Error + Send + Sync>;

/// An aggregate: (type, id).
pub type AggregateKey<'a> = (&'a str, &'a str);

/// A streamed event the relay writes into the events table (the table path), with the state
/// it gets there.
#[derive(Debug)]
pub struct SpillRow<'a> {
    /// The event as the stream carried it.
    pub row: &'a ClaimedRow,
    /// `pending` or `dead`.
    pub status: &'static str,
    /// Attempts so far.
    pub attempts: i32,
    /// Permanent failures so far.
    pub permanent_failures: i32,
    /// Its last error, if it failed.
    pub error: Option<String>,
    /// When pending after a failure: how long until it is due.
    pub backoff: Option<Duration>,
}

/// A hold a spill writes in its own transaction, for the aggregate of events it hands to the
/// table path (a row without a hold would be pending with nothing to publish it, if the relay
/// died between the two, or an operator released the aggregate meanwhile).
#[derive(Debug, Clone, Copy)]
pub struct SpillHold<'a> {
    /// The aggregate.
    pub key: AggregateKey<'a>,
    /// Which of the spilled rows is its head.
    pub head: usize,
    /// Seconds until its retry; `None`: parked.
    pub wait_seconds: Option<f64>,
    /// Where the stream carried the head's event.
    pub since: StreamPosition,
    /// Whether it replaces the aggregate's hold (applied only when the head row is new), or
    /// is written only when the aggregate has none.
    pub replace: bool,
}

impl SpillHold<'_> {
    /// The head row's id when the hold applies, given the spill's ids and which of them it
    /// wrote (see [`SpillHold::replace`]).
    pub fn head_id(&self, ids: &[i64], fresh: &[bool]) -> Option<i64> {
        let (id, new) = (*ids.get(self.head)?, *fresh.get(self.head)?);
        (new || !self.replace).then_some(id)
    }
}

/// What a spill did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spilled {
    /// The relay no longer holds its leases: nothing was written.
    LeaseLost,
    /// Written, or found written before (by event id).
    Written {
        /// The rows' ids, in order.
        ids: Vec<i64>,
        /// For each, whether this spill wrote it (false: found).
        fresh: Vec<bool>,
    },
    /// The table refused the rows for their data (a retry cannot help), with its message.
    Refused(String),
}

/// Where an event is in the replication stream: its transaction's commit position, then its
/// own position in the WAL (the order of the stream: commit order, then order within the
/// transaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct StreamPosition {
    /// The commit record's position.
    pub commit_lsn: u64,
    /// The change's own position.
    pub change_lsn: u64,
}

/// A held or parked aggregate, as the holds table has it.
#[derive(Debug, Clone, PartialEq)]
pub struct HoldRow {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Seconds until the hold lapses (negative: lapsed); `None`: parked.
    pub wait_seconds: Option<f64>,
    /// Where the CDC relay first handed the aggregate to the table path (`None`: the hold
    /// was made otherwise). What the stream sends again from before it was settled before.
    pub since: Option<StreamPosition>,
}

/// The replication slot's state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlotState {
    /// WAL written and not yet confirmed (bytes).
    pub lag_bytes: Option<i64>,
    /// WAL the slot retains (bytes).
    pub retained_bytes: Option<i64>,
    /// The database the slot belongs to when it is not the outbox's, with the outbox's: a
    /// slot of the same name made for another outbox of the cluster, which this one must not
    /// adopt.
    pub elsewhere: Option<(String, String)>,
    /// The database's clock when the state was read.
    pub now: chrono::DateTime<chrono::Utc>,
}

/// The statements of the CDC source and its replication connection.
pub trait CdcDb: Send + Sync {
    /// Writes streamed events into the table in one transaction the stream recognises as the
    /// relay's own; an event already there (by event id) is not written twice. The same
    /// transaction writes `holds` (as [`CdcDb::hold`] does).
    fn spill<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        rows: &'a [SpillRow<'a>],
        holds: &'a [SpillHold<'a>],
    ) -> BoxFuture<'a, Result<Spilled, sqlx::Error>>;

    /// Holds an aggregate at its row `head_id` for `wait_seconds` (`None`: parks it); a new
    /// hold records `since`, the stream position of the event handed over, which a moved hold
    /// keeps. Without `replace`, an existing hold stays as it is. Says whether the leases were
    /// held.
    #[allow(clippy::too_many_arguments)]
    fn hold<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        key: AggregateKey<'a>,
        head_id: i64,
        wait_seconds: Option<f64>,
        since: StreamPosition,
        replace: bool,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

    /// Up to `limit` pending rows of one aggregate, in id order.
    fn pending_of<'a>(
        &'a self,
        key: AggregateKey<'a>,
        limit: i64,
        max_payload: usize,
    ) -> BoxFuture<'a, Result<Vec<ClaimedRow>, sqlx::Error>>;

    /// Up to `limit` pending rows with ids up to `max_id` of aggregates not held, in id order.
    fn catch_up<'a>(
        &'a self,
        max_id: i64,
        limit: i64,
        max_payload: usize,
    ) -> BoxFuture<'a, Result<Vec<ClaimedRow>, sqlx::Error>>;

    /// The highest id that may predate the slot, while catch-up is still to be done.
    fn catch_up_max_id<'a>(
        &'a self,
        slot: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>>;

    /// Records that the rows up to `max_id` are caught up; a record made since (the slot
    /// made again, with a higher id) stays. Says whether the leases were held.
    fn catch_up_done<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        slot: &'a str,
        max_id: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

    /// Every held or parked aggregate.
    fn holds(&self) -> BoxFuture<'_, Result<Vec<HoldRow>, sqlx::Error>>;

    /// Gives an aggregate back to the stream when nothing of it is pending in the table.
    /// Says whether the leases were held, and whether the aggregate was free.
    fn unpark<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        key: AggregateKey<'a>,
    ) -> BoxFuture<'a, Result<(bool, bool), sqlx::Error>>;

    /// The slot's state; `None` when it does not exist.
    fn slot<'a>(&'a self, slot: &'a str) -> BoxFuture<'a, Result<Option<SlotState>, sqlx::Error>>;

    /// The CDC set-ups `outbox migrate --cdc` recorded for this outbox: (slot, publication).
    /// Databases that record none (the simulation's) use the configured or default names.
    fn recorded_slots(&self) -> BoxFuture<'_, Result<Vec<(String, String)>, sqlx::Error>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Ends the replication connection still holding the slot (a previous streamer's). Says
    /// whether the leases were held.
    fn terminate<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        slot: &'a str,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

    /// Writes a non-transactional message with `prefix` into the WAL (idle: the slot advances).
    fn heartbeat<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// How many of the given transactions (32-bit ids, as the stream gives them) are committed
    /// in the WAL but not yet visible to queries.
    fn invisible<'a>(&'a self, xids: &'a [i64]) -> BoxFuture<'a, Result<i64, sqlx::Error>>;

    /// Opens the replication stream of `slot` and `publication`, from the slot's confirmed
    /// position; `application` names the connection.
    fn replicate<'a>(
        &'a self,
        slot: &'a str,
        publication: &'a str,
        application: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn WalStream>, StreamError>>;
}

/// An open replication stream.
pub trait WalStream: Send + Sync {
    /// The next event; `None` when the server ended the stream. Cancel-safe: a call dropped
    /// before it completes loses nothing.
    fn recv(&mut self) -> BoxFuture<'_, Result<Option<ReplicationEvent>, StreamError>>;

    /// Confirms the stream up to `lsn`: reported to the server within its status interval.
    fn update_applied_lsn(&self, lsn: Lsn);

    /// The newest confirmed position the server has been told.
    fn reported_lsn(&self) -> Lsn;

    /// Closes the stream gracefully.
    fn shutdown(self: Box<Self>) -> BoxFuture<'static, ()>;

    /// Drops the connection at once.
    fn abort(self: Box<Self>);
}
