//! Operator actions on an outbox, PostgreSQL, MySQL or SQLite: purge published rows, and list,
//! inspect, replay or skip dead letters. Every mutating dead-letter action is recorded in the
//! `audit` table in the same transaction that performs it. Every backend gives the same
//! result for the same rows (`tests/store_conformance.rs`), the result the simulation's model
//! (`outbox-sim`, `db_admin.rs`) gives.

pub(crate) mod backend;
pub(crate) mod listing;

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};

use backend::AdminBackend;

/// Which dead letters an action applies to. Empty fields match everything.
#[derive(Clone, Debug, Default)]
pub struct DeadLetterFilter {
    /// Exact event type.
    pub event_type: Option<String>,
    /// Exact aggregate type.
    pub aggregate_type: Option<String>,
    /// Exact aggregate id.
    pub aggregate_id: Option<String>,
    /// Occurred at or after.
    pub since: Option<DateTime<Utc>>,
    /// Occurred before.
    pub until: Option<DateTime<Utc>>,
    /// Case-insensitive substring of the last error.
    pub error_contains: Option<String>,
    /// Only these row ids.
    pub ids: Option<Vec<i64>>,
    /// At most this many (default 100).
    pub limit: Option<i64>,
}

impl DeadLetterFilter {
    /// Checks the filter; the error names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if let (Some(since), Some(until)) = (self.since, self.until) {
            if since >= until {
                return Err(format!("--since {since} must be before --until {until}"));
            }
        }
        if matches!(self.limit, Some(n) if n < 1) {
            return Err("--limit must be 1 or more".into());
        }
        if matches!(&self.ids, Some(ids) if ids.is_empty()) {
            return Err("--id needs at least one id".into());
        }
        Ok(())
    }
}

/// A dead-lettered event as operators see it: every value bounded whatever the row holds
/// (text cut to 1024 characters, the error to 4096, at most 32 headers with names cut to 128
/// and values to 256 characters, headers over 64 KiB not shown; `truncated` names what was
/// cut), and the values of sensitive headers (`authorization`, `cookie`, names containing
/// `token`, `secret`, `password`, `api-key`, `signature`, …) replaced by `[redacted]`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DeadLetter {
    /// Row id (what `replay` and `skip` take).
    pub id: i64,
    /// Event id as stored: a UUID (SQLite keeps any text a writer gives, and a row whose id
    /// is not a UUID is dead for that reason).
    pub event_id: String,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Aggregate version.
    pub aggregate_version: Option<i64>,
    /// Event type.
    pub event_type: String,
    /// Schema version.
    pub schema_version: i32,
    /// Destination override.
    pub destination: Option<String>,
    /// Content type.
    pub content_type: String,
    /// Headers as stored, bounded and redacted; a JSON string holding the stored text when
    /// it is JSON the relay cannot parse (a number out of range, nesting too deep), so that
    /// the list never fails on the very rows it must show.
    pub headers: serde_json::Value,
    /// When it happened; `None` when the stored text is not a time (SQLite keeps any text,
    /// and such a row is dead for that reason: `last_error` says so).
    pub occurred_at: Option<DateTime<Utc>>,
    /// Attempts made.
    pub attempts: i32,
    /// Why it is dead.
    pub last_error: String,
    /// Payload size in bytes.
    pub payload_size: i64,
    /// Whether it still parks its aggregate's later events.
    pub parked: bool,
    /// The fields shown cut (`destination`, `headers`, `last_error`, …); empty when every
    /// value is shown whole.
    pub truncated: Vec<&'static str>,
}

/// One audit record.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AuditEntry {
    /// Sequence number.
    pub id: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// Who.
    pub actor: String,
    /// `replay` or `skip`.
    pub action: String,
    /// Which rows.
    pub event_ids: Vec<i64>,
    /// Why.
    pub reason: String,
}

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Replayed {
    /// How many dead events became pending.
    pub replayed: i64,
    /// The dead events asked for that stay dead: each comes before the dead event that parks
    /// its aggregate, which the replay did not include (see [`Admin::replay`]).
    pub not_replayed: Vec<i64>,
}

/// Operator actions on one outbox.
#[derive(Clone, Debug)]
pub struct Admin {
    backend: Arc<dyn AdminBackend>,
}

impl Admin {
    /// Actions through `backend` (each database's folder has its constructor:
    /// [`Admin::new`] for PostgreSQL, [`Admin::mysql`], [`Admin::sqlite`]).
    pub(crate) fn from_backend(backend: Arc<dyn AdminBackend>) -> Self {
        Self { backend }
    }

    /// On a time-partitioned PostgreSQL outbox, creates the partitions from today to a week
    /// ahead that do not exist yet and returns their names (nothing on a plain table, nor on
    /// MySQL or SQLite).
    #[cfg(feature = "postgres")]
    pub async fn create_partitions_ahead(&self) -> Result<Vec<String>, outbox::Error> {
        self.backend.create_partitions_ahead().await
    }

    /// On a time-partitioned PostgreSQL outbox, drops (or, with `archive`, archives then
    /// drops) the partitions that ended more than `retention` ago and hold only published
    /// events (nothing on a plain table, nor on MySQL or SQLite).
    #[cfg(feature = "postgres")]
    pub async fn drop_expired_partitions(
        &self,
        retention: Duration,
        archive: bool,
        dry_run: bool,
    ) -> Result<outbox::postgres::time_partitions::DropReport, outbox::Error> {
        self.backend
            .drop_expired_partitions(retention, archive, dry_run)
            .await
    }

    /// Published rows older than `retention` (what a purge would delete now).
    pub async fn purgeable(&self, retention: Duration) -> Result<i64, sqlx::Error> {
        self.backend.purgeable(retention).await
    }

    /// Deletes (or, with `archive`, moves to `{table}_archive`) one batch of published rows
    /// older than `retention`, oldest first; returns how many. Never pending or dead rows.
    pub async fn purge_batch(
        &self,
        retention: Duration,
        batch: i64,
        archive: bool,
    ) -> Result<u64, sqlx::Error> {
        let batch = batch.max(1);
        self.backend.purge_batch(retention, batch, archive).await
    }

    /// Deletes published rows older than `retention` in batches (short transactions, no long
    /// locks), calling `progress` with the running total; returns the total.
    pub async fn purge(
        &self,
        retention: Duration,
        batch: i64,
        archive: bool,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, sqlx::Error> {
        let mut total = 0;
        loop {
            let deleted = self.purge_batch(retention, batch, archive).await?;
            total += deleted;
            progress(total);
            if deleted < batch.max(1) as u64 {
                return Ok(total);
            }
        }
    }

    /// Deletes inbox rows older than `retention` (see `outbox::postgres::PgInbox::purge` for
    /// the rule on choosing it); returns how many.
    pub async fn purge_inbox(&self, retention: Duration, batch: i64) -> Result<u64, outbox::Error> {
        self.backend.purge_inbox(retention, batch).await
    }

    /// Dead letters matching `filter`, oldest first, each bounded and redacted (see
    /// [`DeadLetter`]): what a listing holds in memory depends on its `limit`, never on what
    /// the rows hold.
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetter>, sqlx::Error> {
        let mut letters = self.backend.dead_letters(filter).await?;
        letters.iter_mut().for_each(listing::bound);
        Ok(letters)
    }

    /// The payload of row `id`, if it exists.
    pub async fn payload(&self, id: i64) -> Result<Option<Vec<u8>>, sqlx::Error> {
        self.backend.payload(id).await
    }

    /// Makes dead events pending again (attempts reset): each aggregate concerned resumes
    /// from its first pending row, in id order, at once. An aggregate parked on a dead event
    /// not among `ids` stays parked: its events after that one are replayed and wait behind
    /// it, those before it stay dead (the park records one dead event per aggregate). Returns
    /// how many were replayed. Recorded in the audit table.
    pub async fn replay(&self, ids: &[i64], actor: &str, reason: &str) -> Result<i64, sqlx::Error> {
        Ok(self.replay_report(ids, actor, reason).await?.replayed)
    }

    /// [`Admin::replay`], saying which of `ids` it left dead, and why (see [`Replayed`]).
    pub async fn replay_report(
        &self,
        ids: &[i64],
        actor: &str,
        reason: &str,
    ) -> Result<Replayed, sqlx::Error> {
        self.backend.replay(ids, actor, reason).await
    }

    /// Abandons dead events: they stay dead but stop parking their aggregates, whose later
    /// events then flow (the one exception to per-aggregate order, G4). Recorded in the audit
    /// table; returns how many aggregates were released.
    pub async fn skip(&self, ids: &[i64], actor: &str, reason: &str) -> Result<i64, sqlx::Error> {
        self.backend.skip(ids, actor, reason).await
    }

    /// The latest `limit` audit records, newest first.
    pub async fn audit(&self, limit: i64) -> Result<Vec<AuditEntry>, sqlx::Error> {
        self.backend.audit(limit).await
    }
}
