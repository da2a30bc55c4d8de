//! The relay's background upkeep, beside the source: the backlog sample behind the lag gauges
//! and readiness (with the repair of rows left waiting, and planner statistics), time
//! partitions ahead (PostgreSQL), and the purge of published rows. Each task runs until the
//! relay stops; `Relay::run` waits for them.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{db::within, health::Health, store::Store, telemetry::Metrics};

/// Samples the backlog gauges (G7).
pub(crate) async fn sample_stats(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    every: Duration,
    answer_within: Duration,
    shutdown: CancellationToken,
) {
    loop {
        match within(answer_within, store.backlog()).await {
            Ok(b) => {
                health.database_ok();
                health.pending(b.pending);
                metrics.pending.set(b.pending);
                metrics.dead.set(b.dead);
                metrics
                    .oldest_pending_age
                    .set(b.oldest_age.map_or(0.0, |a| a.as_secs_f64()));
            }
            Err(error) => {
                metrics.database_errors.inc();
                tracing::warn!(%error, "could not sample the backlog");
            }
        }
        match within(answer_within, store.release_stale()).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                rows = n,
                "set free rows waiting behind a hold that is gone (a release raced another writer)"
            ),
            Err(error) => {
                metrics.database_errors.inc();
                tracing::warn!(%error, "could not check for rows waiting behind a released hold");
            }
        }
        match within(answer_within, store.refresh_statistics()).await {
            Ok(true) => tracing::info!("refreshed the outbox table's planner statistics"),
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "could not refresh planner statistics"),
        }
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// The relay's upkeep, every `every`: on a time-partitioned PostgreSQL outbox, creates the
/// partitions a week ahead and, with a retention, drops expired partitions that hold only
/// published events; then, with a retention, deletes published rows older than it in batches
/// of 1000. Never touches pending or dead rows.
pub(crate) async fn maintain_periodically(
    admin: crate::admin::Admin,
    retention: Option<Duration>,
    every: Duration,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
        first = false;
        #[cfg(feature = "postgres")]
        maintain_time_partitions(&admin, retention, &metrics).await;
        let Some(retention) = retention else {
            continue;
        };
        let mut last = 0;
        let purged = admin
            .purge(retention, 1000, false, |total| {
                metrics.purged.inc_by(total - last);
                last = total;
            })
            .await;
        match purged {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, ?retention, "purged published events"),
            Err(error) => {
                metrics.database_errors.inc();
                tracing::warn!(%error, "purge failed; will retry");
            }
        }
    }
}

/// On a time-partitioned PostgreSQL outbox: creates the partitions a week ahead and, with a
/// retention, drops expired partitions that hold only published events.
#[cfg(feature = "postgres")]
async fn maintain_time_partitions(
    admin: &crate::admin::Admin,
    retention: Option<Duration>,
    metrics: &Metrics,
) {
    match admin.create_partitions_ahead().await {
        Ok(created) if !created.is_empty() => {
            tracing::info!(?created, "created time partitions ahead");
        }
        Ok(_) => {}
        Err(error) => {
            metrics.database_errors.inc();
            tracing::warn!(%error, "creating time partitions failed; will retry");
        }
    }
    let Some(retention) = retention else {
        return;
    };
    match admin.drop_expired_partitions(retention, false, false).await {
        Ok(report) => {
            for (name, rows) in &report.dropped {
                metrics.purged.inc_by(*rows as u64);
                tracing::info!(partition = %name, rows, "dropped expired time partition");
            }
            if !report.kept.is_empty() {
                tracing::info!(kept = ?report.kept,
                    "expired time partitions kept: they still hold pending or dead events");
            }
            if !report.busy.is_empty() {
                tracing::info!(busy = ?report.busy,
                    "expired time partitions left for the next run: another relay was \
                     dropping partitions, or a transaction was using the events table");
            }
        }
        Err(error) => {
            metrics.database_errors.inc();
            tracing::warn!(%error, "dropping expired time partitions failed; will retry");
        }
    }
}
