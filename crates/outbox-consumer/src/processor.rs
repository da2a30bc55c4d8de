use std::{panic::AssertUnwindSafe, sync::Arc, time::Instant};

use futures::FutureExt;
use outbox::postgres::{PgInbox, Seen};
use sqlx::PgPool;

use crate::{
    gate::Verdict,
    metrics::{ConsumerMetrics, Count, Counts},
    Envelope, Handler, HandlerError, UpcastError, Upcasters, VersionGate,
};

/// What processing did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The handler ran and its transaction committed.
    Applied,
    /// The inbox already had the event, or the version gate had applied its version:
    /// nothing ran; safe to ack.
    Duplicate,
    /// A fan-out copy, and this processor skips copies ([`Processor::skip_fan_out_copies`]):
    /// nothing ran; safe to ack.
    CopySkipped,
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
    counts: Counts,
    gate: Option<Arc<VersionGate>>,
    skip_copies: bool,
}

impl Processor {
    /// A processor for consumer `name`, with the inbox in `tables`' schema.
    pub fn new(
        pool: PgPool,
        tables: &outbox::Tables,
        name: impl Into<String>,
        handler: Arc<dyn Handler>,
    ) -> Self {
        let name = name.into();
        let metrics = ConsumerMetrics::new();
        Self {
            pool,
            inbox: PgInbox::new(tables),
            counts: metrics.of(&name),
            name,
            handler,
            upcasters: Upcasters::new(),
            metrics,
            gate: None,
            skip_copies: false,
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
        Self {
            counts: metrics.of(&self.name),
            metrics,
            ..self
        }
    }

    /// The same processor, applying each aggregate's events in `aggregate_version` order
    /// through `gate`: a version applied already is skipped as a duplicate, one that comes
    /// before its predecessor is retried until the predecessor is applied (never
    /// dead-lettered). Events without an aggregate version pass. Only for a consumer that
    /// receives *every* event of the aggregates it handles: one filtered by event type sees
    /// gaps that never fill.
    pub fn with_version_gate(self, gate: VersionGate) -> Self {
        Self {
            gate: Some(Arc::new(gate)),
            ..self
        }
    }

    /// The same processor, skipping fan-out copies (messages with `copy-of-schema-version`).
    ///
    /// For a consumer that reads the event's own destination as well as a copy's (during a
    /// migration, `orders.v1` and `orders.v2` to receive old writers' V1 events too): it would
    /// otherwise apply whichever of the event and its copy it handles first, and after a failed
    /// attempt of the event that is the downcast copy (its later version then skipped as a
    /// duplicate). With this, the event applies from its own message only. Leave it off for a
    /// consumer that reads only copies' destinations: it would skip every copied event.
    pub fn skip_fan_out_copies(self) -> Self {
        Self {
            skip_copies: true,
            ..self
        }
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
            self.counts.add(Count::Panics);
        }
        result
    }

    /// Counts one `count` for this consumer (the runners' dead letters).
    pub(crate) fn count(&self, count: Count) {
        self.counts.add(count);
    }

    /// The consumer name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// In one transaction: inbox check, version gate (when set), handler (when new), commit;
    /// any error rolls the transaction back before it returns. The event is upcast first
    /// (a no-op when it is already current, as after [`Processor::upcast`]). A handler that
    /// panics fails this message like an `Err` (its transaction is rolled back); a database
    /// outage comes back as an error with [`HandlerError::is_infrastructure`] set.
    pub async fn apply(&self, event: &Envelope) -> Result<Outcome, HandlerError> {
        if self.skip_copies && event.copy_of_schema_version.is_some() {
            self.counts.add(Count::CopiesSkipped);
            return Ok(Outcome::CopySkipped);
        }
        let started = Instant::now();
        let result = self.attempt(event).await;
        self.counts.observe_handler(started.elapsed().as_secs_f64());
        let count = match &result {
            Ok(Outcome::Applied) => Count::Handled,
            Ok(Outcome::Duplicate) => Count::Duplicates,
            Ok(Outcome::CopySkipped) => Count::CopiesSkipped,
            Err(e) if e.is_infrastructure() => Count::InfrastructureFailures,
            Err(e) if e.is_out_of_order() => Count::OutOfOrder,
            Err(_) => Count::Failures,
        };
        self.counts.add(count);
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
        match self.in_transaction(&mut tx, event).await {
            Ok(Outcome::Applied) => {
                tx.commit().await?;
                Ok(Outcome::Applied)
            }
            Ok(skipped) => {
                tx.rollback().await?;
                Ok(skipped)
            }
            Err(e) => {
                // Rolled back now, not when the pooled connection is next used: until then
                // its locks (the inbox row, the aggregate's version row) would hold back the
                // redelivery.
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }

    /// Inbox check, version gate, handler, in the caller's transaction. `Duplicate` leaves
    /// nothing worth committing.
    async fn in_transaction(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &Envelope,
    ) -> Result<Outcome, HandlerError> {
        let seen = self
            .inbox
            .record_message(
                &mut *tx,
                &self.name,
                &event.message_id,
                Some(&event.event_type),
            )
            .await?;
        if seen == Seen::Duplicate {
            return Ok(Outcome::Duplicate);
        }
        let gated = match &self.gate {
            None => None,
            Some(gate) => match gate.check(&mut *tx, &self.name, event).await? {
                Verdict::Stale => return Ok(Outcome::Duplicate),
                Verdict::Next(key) => key.map(|key| (gate, key)),
            },
        };
        match AssertUnwindSafe(self.handler.handle(&mut *tx, event))
            .catch_unwind()
            .await
        {
            Ok(result) => result?,
            Err(panic) => {
                self.counts.add(Count::Panics);
                return Err(HandlerError::new(format!(
                    "handler {}",
                    crate::panic::message(panic)
                )));
            }
        }
        if let Some((gate, key)) = gated {
            gate.advance(&mut *tx, &self.name, &key).await?;
        }
        Ok(Outcome::Applied)
    }
}
