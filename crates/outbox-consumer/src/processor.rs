use std::{panic::AssertUnwindSafe, sync::Arc, time::Instant};

use futures::FutureExt;
use outbox::postgres::{PgInbox, Seen};
use sqlx::PgPool;

use crate::{
    metrics::{ConsumerMetrics, Count},
    Envelope, Handler, HandlerError, UpcastError, Upcasters,
};

/// What processing did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The handler ran and its transaction committed.
    Applied,
    /// The inbox already had the event: nothing ran; safe to ack.
    Duplicate,
}

/// Runs a handler through the inbox, broker-agnostic. Runners call [`Processor::apply`] for
/// each message and ack only when it returns `Ok`.
#[derive(Clone)]
pub struct Processor {
    pool: PgPool,
    inbox: PgInbox,
    name: String,
    handler: Arc<dyn Handler>,
    upcasters: Upcasters,
    metrics: ConsumerMetrics,
}

impl Processor {
    /// A processor for consumer `name`, with the inbox in `tables`' schema.
    pub fn new(
        pool: PgPool,
        tables: &outbox::Tables,
        name: impl Into<String>,
        handler: Arc<dyn Handler>,
    ) -> Self {
        Self {
            pool,
            inbox: PgInbox::new(tables),
            name: name.into(),
            handler,
            upcasters: Upcasters::new(),
            metrics: ConsumerMetrics::new(),
        }
    }

    /// The same processor, bringing every event to its current version with `upcasters`
    /// before the handler sees it (payload rewritten, `schema_version` set to the current one).
    pub fn with_upcasters(self, upcasters: Upcasters) -> Self {
        Self { upcasters, ..self }
    }

    /// The same processor, counting into `metrics` (shared with other processors and
    /// registered for export by the application). Each processor has counters of its own
    /// otherwise.
    pub fn with_metrics(self, metrics: ConsumerMetrics) -> Self {
        Self { metrics, ..self }
    }

    /// What this processor counts.
    pub fn metrics(&self) -> &ConsumerMetrics {
        &self.metrics
    }

    /// The event as the handler will see it. Runners call this right after decoding, and
    /// dead-letter the message at once on an error (it cannot succeed on a retry).
    pub fn upcast(&self, event: Envelope) -> Result<Envelope, UpcastError> {
        let result = self.upcasters.upcast_envelope(event);
        if matches!(&result, Err(UpcastError::Panicked { .. })) {
            self.metrics.add(&self.name, Count::Panics);
        }
        result
    }

    /// The consumer name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// In one transaction: inbox check, handler (when new), commit. The event is upcast first
    /// (a no-op when it is already current, as after [`Processor::upcast`]). A handler that
    /// panics fails this message like an `Err` (its transaction is rolled back); a database
    /// outage comes back as an error with [`HandlerError::is_infrastructure`] set.
    pub async fn apply(&self, event: &Envelope) -> Result<Outcome, HandlerError> {
        let started = Instant::now();
        let result = self.attempt(event).await;
        self.metrics
            .observe_handler(&self.name, started.elapsed().as_secs_f64());
        let count = match &result {
            Ok(Outcome::Applied) => Count::Handled,
            Ok(Outcome::Duplicate) => Count::Duplicates,
            Err(e) if e.is_infrastructure() => Count::InfrastructureFailures,
            Err(_) => Count::Failures,
        };
        self.metrics.add(&self.name, count);
        result
    }

    async fn attempt(&self, event: &Envelope) -> Result<Outcome, HandlerError> {
        let upcast;
        let event = match self.upcasters.current_version(&event.event_type) {
            Some(current) if current != event.schema_version => {
                upcast = self
                    .upcast(event.clone())
                    .map_err(|e| HandlerError::new(e.to_string()))?;
                &upcast
            }
            _ => event,
        };
        let mut tx = self.pool.begin().await?;
        let seen = self
            .inbox
            .record(&mut tx, &self.name, event.event_id)
            .await?;
        if seen == Seen::Duplicate {
            tx.rollback().await?;
            return Ok(Outcome::Duplicate);
        }
        // The transaction is dropped, so rolled back, when the handler panics.
        match AssertUnwindSafe(self.handler.handle(&mut tx, event))
            .catch_unwind()
            .await
        {
            Ok(result) => result?,
            Err(panic) => {
                self.metrics.add(&self.name, Count::Panics);
                return Err(HandlerError::new(format!(
                    "handler {}",
                    crate::panic::message(panic)
                )));
            }
        }
        tx.commit().await?;
        Ok(Outcome::Applied)
    }
}
