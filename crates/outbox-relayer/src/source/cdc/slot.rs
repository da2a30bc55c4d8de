//! The slot's gauges: WAL not yet confirmed (in bytes and in seconds), WAL retained, and the
//! retained-WAL alarm.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::context::Context;

/// The commit time of the oldest streamed transaction with events not yet confirmed: set by
/// the stream, read by the slot sampler, which measures it against the database's clock on
/// its own schedule (a stream stuck inside one call does not freeze the gauge).
#[derive(Debug, Default)]
pub(crate) struct Unconfirmed(Mutex<Option<DateTime<Utc>>>);

impl Unconfirmed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<DateTime<Utc>>> {
        self.0.lock().expect("not poisoned")
    }

    /// A transaction committed at `at` has events to confirm: the oldest such time is kept
    /// (a stream started again sends unconfirmed transactions again).
    pub(super) fn streamed(&self, at: Option<DateTime<Utc>>) {
        let mut since = self.lock();
        if since.is_none() {
            *since = at;
        }
    }

    /// Everything streamed is confirmed, or this relay no longer streams the slot.
    pub(super) fn clear(&self) {
        *self.lock() = None;
    }

    /// The commit time of the oldest transaction not yet confirmed.
    pub(super) fn since(&self) -> Option<DateTime<Utc>> {
        *self.lock()
    }
}

/// Samples the slot: WAL not confirmed, WAL retained, the alarm.
pub(super) async fn sample_slot(ctx: Arc<Context>, slot: String, shutdown: CancellationToken) {
    let max = ctx.config.cdc.max_retained_wal_bytes;
    let mut alarmed = false;
    loop {
        match ctx.db.slot(&slot).await {
            Ok(Some(state)) => {
                let lag = state.lag_bytes;
                let retained = state.retained_bytes;
                let retained = retained.unwrap_or(0).max(0);
                ctx.metrics.cdc_slot_lag_bytes.set(lag.unwrap_or(0).max(0));
                // By the database's clock, as the commit times are.
                ctx.metrics
                    .cdc_slot_lag_seconds
                    .set(ctx.unconfirmed.since().map_or(0.0, |t| {
                        (state.now - t).num_milliseconds().max(0) as f64 / 1e3
                    }));
                ctx.metrics.cdc_retained_wal_bytes.set(retained);
                let over = retained as u64 >= max / 10 * 8;
                ctx.metrics.cdc_retained_wal_alarm.set(i64::from(over));
                if over && !alarmed {
                    tracing::error!(retained_bytes = retained, max_retained_wal_bytes = max,
                        slot = %slot, "replication slot retains over 80% of the allowed WAL: \
                        is the CDC relay stalled? (see docs/operations.md, CDC)");
                }
                alarmed = over;
            }
            Ok(None) => {
                tracing::error!(slot = %slot, "replication slot not found: run `outbox migrate --cdc` \
                    (rows written meanwhile are caught up from the table when it is recreated)");
            }
            Err(error) => tracing::warn!(%error, "could not sample the replication slot"),
        }
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(ctx.config.stats_interval) => {}
        }
    }
}
