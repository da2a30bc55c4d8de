//! Deadlines: a scheduler finds instances whose state timed out and runs the [`TIMEOUT`] step
//! for each, one transaction per instance, through the same machinery as events.

use std::{panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures::FutureExt;
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
/// the lock, so each timeout fires once. An instance whose timeout step fails (its stored state
/// or data no longer decodes, `react` returns an error or panics, its writes fail) is retried
/// after a backoff ([`TIMEOUT_RETRY_FIRST`], doubling, at most [`TIMEOUT_RETRY_LONGEST`]) and
/// never holds back the timeouts of the others.
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
    /// off, are not counted). Whatever fails for one instance (its row no longer decodes, its
    /// step returns an error or panics, its writes or commit fail) puts that instance off and
    /// the round goes on; only a failure of the infrastructure
    /// ([`HandlerError::is_infrastructure`]: the database unreachable) ends the round with
    /// an error, leaving the rest for the next one.
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
                match self.fire(&correlation_id).await {
                    Ok(true) => {
                        fired += 1;
                        progressed = true;
                    }
                    // Another scheduler or a step has it, or it moved on.
                    Ok(false) => {}
                    Err(error) if error.is_infrastructure() => return Err(error),
                    Err(error) => progressed |= self.defer(&correlation_id, &error).await?,
                }
            }
            // A full batch may hide more due instances behind it; a batch where nothing fired
            // or was put off would only be read again.
            if !full || !progressed {
                return Ok(fired);
            }
        }
    }

    /// Runs the timeout step of one instance in a transaction of its own: `Ok(true)` when it
    /// fired, `Ok(false)` when the instance is no longer due or another scheduler holds it.
    /// A panic in the saga's code fails the step like an error.
    async fn fire(&self, correlation_id: &str) -> Result<bool, HandlerError> {
        let rt = &*self.runtime;
        let mut tx = self.pool.begin().await?;
        let step = AssertUnwindSafe(async {
            // Decoding the row is part of the step: a row that no longer decodes fails this
            // instance only.
            let Some(instance) = rt.load_due(&mut tx, correlation_id).await? else {
                return Ok(false);
            };
            rt.step(&mut tx, correlation_id, instance, &Trigger::Timeout)
                .await
                .map(|_| true)
        })
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            Err(HandlerError::new(format!(
                "saga {} {correlation_id:?}: timeout step {}",
                rt.saga.name(),
                crate::panic::message(panic)
            )))
        });
        match step {
            Ok(fired) => {
                tx.commit().await?;
                Ok(fired)
            }
            Err(error) => {
                // Rolled back before the deferral, which needs the row lock it holds. A
                // rollback that fails has lost its connection, and the server rolls back.
                if let Err(rollback) = tx.rollback().await {
                    tracing::debug!(saga = rt.saga.name(), correlation_id, error = %rollback,
                        "saga timeout step: rollback failed");
                }
                Err(error)
            }
        }
    }

    /// Puts off the timeout of an instance whose step failed, and records the failure (the
    /// error in a `timeout_failed` step, and a WARN line with the saga type, the correlation id
    /// and the error). Returns whether the instance was put off: not when it is no longer due.
    /// A deferral that fails is logged and the round goes on (the instance, still due, is
    /// tried again next round), unless the database is unreachable.
    async fn defer(
        &self,
        correlation_id: &str,
        error: &HandlerError,
    ) -> Result<bool, HandlerError> {
        let rt = &*self.runtime;
        let saga = rt.saga.name();
        let deferred: Result<Option<i64>, sqlx::Error> = sqlx::query_scalar(&rt.defer)
            .bind(saga)
            .bind(correlation_id)
            .bind(error.to_string())
            .bind(TIMEOUT_RETRY_FIRST.as_secs_f64())
            .bind(TIMEOUT_RETRY_LONGEST.as_secs_f64())
            .bind(TIMEOUT)
            .fetch_optional(&self.pool)
            .await;
        match deferred {
            Ok(Some(before)) => {
                tracing::warn!(saga, correlation_id, %error, failures = before + 1,
                    "saga timeout step failed; retried after a backoff, other timeouts go on");
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(failed) => {
                let failed = HandlerError::from(failed);
                if failed.is_infrastructure() {
                    return Err(failed);
                }
                tracing::error!(saga, correlation_id, %error, deferral = %failed,
                    "saga timeout step failed and could not be put off; tried again next round");
                Ok(false)
            }
        }
    }

    /// Fires deadlines until `stop`. A failing round is logged and retried next interval; so
    /// is a round that panics outside any one instance's step, so the task ends only when
    /// stopped.
    pub async fn run(self, stop: CancellationToken) {
        let saga = self.runtime.saga.name();
        loop {
            match AssertUnwindSafe(self.fire_due()).catch_unwind().await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::debug!(saga, fired = n, "{TIMEOUT}"),
                Ok(Err(e)) => {
                    tracing::warn!(saga, error = %e, "saga timeouts: round failed, retrying")
                }
                Err(panic) => tracing::error!(
                    saga,
                    error = crate::panic::message(panic),
                    "saga timeouts: round failed, retrying"
                ),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}
