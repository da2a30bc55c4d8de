//! The sweeper: beside a runner's lanes, it applies the held events that are due (a retry
//! whose backoff passed, an aggregate an operator released, the next event after a drain that
//! stopped, a first-seen aggregate whose settle time passed), keeps the held gauges current
//! from the database, and runs the consumer's inbox retention.
//!
//! Every runner of a consumer sweeps; the aggregate's state row lock (and the held row's, for
//! events without an aggregate) makes each held event applied once, in order.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use futures::{stream::FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;

use super::Worker;
use crate::{store::Due, DeadLetters};

/// Inbox rows deleted per statement.
const PURGE_BATCH: i64 = 1000;

impl<S: DeadLetters> Worker<S> {
    /// Sweeps every `config.sweep_interval` until `shutdown`, then lets the drains it started
    /// finish. A sweep reads the gauges, then starts the due aggregates that are not draining
    /// already (at most `config.concurrency` at once) without waiting for them: an aggregate
    /// whose handler is slow holds its own drain, never another aggregate's nor the gauges.
    pub(crate) async fn sweep(&self, shutdown: &CancellationToken) {
        let retry = self.retry();
        let mut last_purge: Option<Instant> = None;
        let mut draining: HashSet<Due> = HashSet::new();
        let mut running = FuturesUnordered::new();
        loop {
            self.update_gauges().await;
            let mut full = false;
            match self.processor.due_now().await {
                Ok((due, more)) => {
                    full = more;
                    for due in due {
                        if draining.len() >= self.config.concurrency {
                            break;
                        }
                        if draining.insert(due.clone()) {
                            let retry = &retry;
                            running.push(async move {
                                self.processor.apply_one(&due, retry).await;
                                due
                            });
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, consumer = self.processor.name(),
                        "sweeping held events failed; trying again");
                }
            }
            if let Some(retention) = self.config.inbox_retention {
                let due = last_purge.is_none_or(|at| at.elapsed() >= self.config.purge_interval);
                if due {
                    last_purge = Some(Instant::now());
                    self.purge_inbox(retention).await;
                }
            }
            // The next sweep: after the interval, or (a full batch: more is due) as soon as
            // a drain finishes.
            let next = tokio::time::sleep(self.config.sweep_interval);
            tokio::pin!(next);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => {
                        while let Some(due) = running.next().await {
                            draining.remove(&due);
                        }
                        return;
                    }
                    Some(due) = running.next(), if !running.is_empty() => {
                        draining.remove(&due);
                        if full {
                            break;
                        }
                    }
                    () = &mut next => break,
                }
            }
        }
    }

    /// Reads the held gauges from the database.
    async fn update_gauges(&self) {
        match self.processor.store().gauges(self.processor.pool()).await {
            Ok(gauges) => self.processor.counts().set_held(&gauges),
            Err(error) => tracing::warn!(%error, consumer = self.processor.name(),
                "reading the held gauges failed; read again at the next sweep"),
        }
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
