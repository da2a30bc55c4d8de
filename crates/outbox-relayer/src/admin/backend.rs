//! The seam between [`super::Admin`] and a database: what each backend's operator actions
//! implement (`postgres/admin.rs`, `mysql/admin.rs`, `sqlite/admin.rs`).

use std::time::Duration;

use futures::future::BoxFuture;
#[cfg(feature = "postgres")]
use outbox::postgres::time_partitions::DropReport;

use super::{AuditEntry, DeadLetter, DeadLetterFilter, Replayed};

/// A future of an operator action's result.
pub(crate) type Action<'a, T, E = sqlx::Error> = BoxFuture<'a, Result<T, E>>;

/// Operator actions on one database's outbox. Every backend gives the same result for the
/// same rows (`tests/store_conformance.rs`).
pub(crate) trait AdminBackend: Send + Sync + std::fmt::Debug {
    /// Published rows older than `retention` (what a purge would delete now).
    fn purgeable(&self, retention: Duration) -> Action<'_, i64>;

    /// Deletes (or, with `archive`, moves to the archive table) up to `batch` published rows
    /// older than `retention`; returns how many.
    fn purge_batch(&self, retention: Duration, batch: i64, archive: bool) -> Action<'_, u64>;

    /// Deletes up to `batch` inbox entries older than `retention`; returns how many.
    fn purge_inbox(&self, retention: Duration, batch: i64) -> Action<'_, u64, outbox::Error>;

    /// The dead letters `filter` selects.
    fn dead_letters<'a>(&'a self, filter: &'a DeadLetterFilter) -> Action<'a, Vec<DeadLetter>>;

    /// A dead letter's payload, whole.
    fn payload(&self, id: i64) -> Action<'_, Option<Vec<u8>>>;

    /// Returns dead letters to pending, audited, unless another dead letter of their aggregate
    /// would be passed.
    fn replay<'a>(
        &'a self,
        ids: &'a [i64],
        actor: &'a str,
        reason: &'a str,
    ) -> Action<'a, Replayed>;

    /// Marks dead letters as skipped, audited; returns how many.
    fn skip<'a>(&'a self, ids: &'a [i64], actor: &'a str, reason: &'a str) -> Action<'a, i64>;

    /// The latest `limit` audit entries.
    fn audit(&self, limit: i64) -> Action<'_, Vec<AuditEntry>>;

    /// On a time-partitioned outbox, creates the partitions ahead (none elsewhere).
    #[cfg(feature = "postgres")]
    fn create_partitions_ahead(&self) -> Action<'_, Vec<String>, outbox::Error> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// On a time-partitioned outbox, drops the expired partitions (none elsewhere).
    #[cfg(feature = "postgres")]
    fn drop_expired_partitions(
        &self,
        retention: Duration,
        archive: bool,
        dry_run: bool,
    ) -> Action<'_, DropReport, outbox::Error> {
        let _ = (retention, archive, dry_run);
        Box::pin(async { Ok(DropReport::default()) })
    }
}
