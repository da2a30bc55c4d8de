//! The slot's gauges: WAL not yet confirmed (in bytes and in seconds), WAL retained, and the
//! retained-WAL alarm.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::context::Context;

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
