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

/// The first delay before a failed timeout step is tried again; it doubles with each
/// consecutive failure up to [`TIMEOUT_RETRY_LONGEST`].
pub const TIMEOUT_RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest delay between two tries of a failing timeout step.
pub const TIMEOUT_RETRY_LONGEST: Duration = Duration::from_secs(600);

/// Fires the deadlines of one saga type. Any number may run at once (one per consumer
/// process, say): an instance is locked with `SKIP LOCKED` and its deadline checked again under
/// the lock, so each timeout fires once. An instance whose timeout step fails is retried after
/// a backoff ([`TIMEOUT_RETRY_FIRST`], doubling, at most [`TIMEOUT_RETRY_LONGEST`]) and never holds back the
/// timeouts of the others.
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

    /// Fires every deadline that has passed now; returns how many fired (failed steps, put
    /// off, are not counted).
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
                match rt
                    .step(&mut tx, &correlation_id, instance, &Trigger::Timeout)
                    .await
                {
                    Ok(_) => {
                        tx.commit().await?;
                        fired += 1;
                    }
                    // This instance's step fails (its `react`, its data, a concurrent change):
                    // it is put off with a backoff and the round goes on with the others. A
                    // failing database fails the deferral too, and with it the round.
                    Err(error) => {
                        // Rolled back before the deferral, which needs the row lock it holds.
                        tx.rollback().await?;
                        self.defer(&correlation_id, &error).await?;
                    }
                }
                progressed = true;
            }
            if !full || !progressed {
                return Ok(fired);
            }
        }
    }

    /// Puts off the timeout of an instance whose step failed, and records the failure.
    async fn defer(&self, correlation_id: &str, error: &HandlerError) -> Result<(), HandlerError> {
        let rt = &*self.runtime;
        let failures: Option<i64> = sqlx::query_scalar(&rt.defer)
            .bind(rt.saga.name())
            .bind(correlation_id)
            .bind(error.to_string())
            .bind(TIMEOUT_RETRY_FIRST.as_secs_f64())
            .bind(TIMEOUT_RETRY_LONGEST.as_secs_f64())
            .bind(TIMEOUT)
            .fetch_optional(&self.pool)
            .await?;
        if let Some(before) = failures {
            tracing::warn!(saga = rt.saga.name(), correlation_id, %error, failures = before + 1,
                "saga timeout step failed; retried after a backoff, other timeouts go on");
        }
        Ok(())
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
