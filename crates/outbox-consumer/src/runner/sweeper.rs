//! The sweeper: beside a runner's lanes, it applies the held events that are due (a retry
//! whose backoff passed, an aggregate an operator released, the next event after a drain that
//! stopped, a first-seen aggregate whose settle time passed), keeps the held gauges current
//! from the database, and runs the consumer's inbox retention.
//!
//! Every runner of a consumer sweeps; the aggregate's state row lock (and the held row's, for
//! events without an aggregate) makes each held event applied once, in order.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Worker;
use crate::DeadLetters;

/// Inbox rows deleted per statement.
const PURGE_BATCH: i64 = 1000;

impl<S: DeadLetters> Worker<S> {
    /// Sweeps every `config.sweep_interval` until `shutdown`.
    pub(crate) async fn sweep(&self, shutdown: &CancellationToken) {
        let mut last_purge: Option<Instant> = None;
        loop {
            let full = match self.sweep_once().await {
                Ok(full) => full,
                Err(error) => {
                    tracing::warn!(%error, consumer = self.processor.name(),
                        "sweeping held events failed; trying again");
                    false
                }
            };
            if let Some(retention) = self.config.inbox_retention {
                let due = last_purge.is_none_or(|at| at.elapsed() >= self.config.purge_interval);
                if due {
                    last_purge = Some(Instant::now());
                    self.purge_inbox(retention).await;
                }
            }
            if full {
                continue;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.config.sweep_interval) => {}
            }
        }
    }

    /// Applies what is due now (up to one batch) and updates the gauges. Returns whether the
    /// batch was full (more may be due).
    pub(crate) async fn sweep_once(&self) -> Result<bool, crate::HandlerError> {
        let full = self.processor.apply_due(&self.config, &self.dead).await?;
        let gauges = self.processor.store().gauges(self.processor.pool()).await?;
        self.processor.counts().set_held(&gauges);
        Ok(full)
    }

    async fn purge_inbox(&self, retention: Duration) {
        let store = self.processor.store();
        let mut total = 0;
        loop {
            match store
                .purge_inbox(self.processor.pool(), retention, PURGE_BATCH)
                .await
            {
                Ok(deleted) => {
                    total += deleted;
                    self.processor.counts().purged(deleted);
                    if deleted < PURGE_BATCH as u64 {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, consumer = self.processor.name(),
                        "inbox retention failed; tried again at the next interval");
                    break;
                }
            }
        }
        if total > 0 {
            tracing::info!(consumer = self.processor.name(), deleted = total,
                retention = %humantime::format_duration(retention), "inbox rows purged");
        }
    }
}
