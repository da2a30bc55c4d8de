//! Deadlines: a scheduler finds instances whose state timed out and runs the [`TIMEOUT`] step
//! for each, one transaction per instance, through the same machinery as events.

use std::{sync::Arc, time::Duration};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{
    definition::{Saga, Trigger, TIMEOUT},
    runtime::Runtime,
};
use crate::HandlerError;

/// Fires the deadlines of one saga type. Any number may run at once (one per consumer
/// process, say): an instance is locked with `SKIP LOCKED` and its deadline checked again under
/// the lock, so each timeout fires once.
pub struct SagaTimeouts<S: Saga> {
    pool: PgPool,
    runtime: Arc<Runtime<S>>,
    interval: Duration,
    batch: i64,
}

impl<S: Saga> SagaTimeouts<S> {
    pub(crate) fn new(pool: PgPool, runtime: Arc<Runtime<S>>) -> Self {
        Self {
            pool,
            runtime,
            interval: Duration::from_secs(1),
            batch: 100,
        }
    }

    /// How often to look for passed deadlines (default 1 s): a timeout fires at most this
    /// long after its deadline.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(10));
        self
    }

    /// Fires every deadline that has passed now; returns how many fired.
    pub async fn fire_due(&self) -> Result<usize, HandlerError> {
        let rt = &*self.runtime;
        let mut fired = 0;
        loop {
            let due: Vec<String> = sqlx::query_scalar(&rt.due)
                .bind(rt.saga.name())
                .bind(self.batch)
                .fetch_all(&self.pool)
                .await?;
            let full = due.len() as i64 == self.batch;
            let mut progressed = false;
            for correlation_id in due {
                let mut tx = self.pool.begin().await?;
                let Some(instance) = rt.load_due(&mut tx, &correlation_id).await? else {
                    continue; // another scheduler or a step has it, or it moved on
                };
                rt.step(&mut tx, &correlation_id, instance, &Trigger::Timeout)
                    .await?;
                tx.commit().await?;
                fired += 1;
                progressed = true;
            }
            if !full || !progressed {
                return Ok(fired);
            }
        }
    }

    /// Fires deadlines until `stop`. A failing round is logged and retried next interval.
    pub async fn run(self, stop: CancellationToken) {
        loop {
            match self.fire_due().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(saga = self.runtime.saga.name(), fired = n, "{TIMEOUT}"),
                Err(e) => tracing::warn!(saga = self.runtime.saga.name(), error = %e,
                    "saga timeouts: round failed, retrying"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}
