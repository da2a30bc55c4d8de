//! The processor: applies an event once, in its aggregate's order, or holds it.
//!
//! One transaction per delivery: the inbox row, the aggregate's version state (locked when
//! the version gate orders the event), then either the handler and the new version, or the
//! message stored in `consumer_held` with why. An event is never acknowledged unapplied: it
//! is applied, held (and counted, with a reason an operator can read), skipped as a duplicate
//! of one applied, or failed (the runner holds it for its next attempt or dead-letters it).
//! Held events are applied by the drain ([`drain`]) in their aggregate's order as soon as
//! their turn comes.

mod drain;

use std::{panic::AssertUnwindSafe, sync::Arc, time::Instant};

use futures::FutureExt;
use sqlx::{PgConnection, PgPool};

use crate::{
    gate::{decide, Start},
    metrics::{ConsumerMetrics, Count, Counts},
    store::{Aggregate, Hold, Statements, Store},
    Envelope, Handler, HandlerError, Message, UpcastError, Upcasters, VersionGate,
};

pub use drain::DeadLetters;
pub(crate) use drain::Retry;

/// What processing did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and its transaction committed.
    Applied,
    /// The inbox already had the event, or the version gate had applied its version:
    /// nothing ran; safe to ack.
    Duplicate,
    /// A fan-out copy, and this processor skips copies ([`Processor::skip_fan_out_copies`]):
    /// nothing ran; safe to ack.
    CopySkipped,
    /// Stored in the consumer's database to be applied in its aggregate's order (an earlier
    /// event of its aggregate is not applied yet): safe to ack. A runner applies it when its
    /// turn comes.
    Held,
}

/// A delivery's outcome, and the aggregate whose held events are due now because of it.
pub(crate) struct Delivered {
    pub(crate) outcome: Outcome,
    pub(crate) drain: Option<Aggregate>,
}

/// How many times a transaction that met a concurrent first event of its aggregate is tried
/// again at once before its failure counts as an attempt.
const CONFLICT_RETRIES: u32 = 16;

/// Runs a handler through the inbox and the version gate, broker-agnostic. Runners call it
/// for each message and ack only when it returns `Ok`.
#[derive(Clone)]
pub struct Processor {
    pool: PgPool,
    sql: Arc<Statements>,
    name: String,
    handler: Arc<dyn Handler>,
    upcasters: Upcasters,
    metrics: ConsumerMetrics,
    counts: Counts,
    gate: Option<Start>,
    skip_copies: bool,
}

impl Processor {
    /// A processor for consumer `name`, with its tables (inbox, version state, held events)
    /// in `tables`' schema.
    pub fn new(
        pool: PgPool,
        tables: &outbox::Tables,
        name: impl Into<String>,
        handler: Arc<dyn Handler>,
    ) -> Self {
        let name = name.into();
        let metrics = ConsumerMetrics::new();
        let upcasters = handler.upcasters();
        Self {
            pool,
            sql: Arc::new(Statements::new(tables)),
            counts: metrics.of(&name),
            name,
            handler,
            upcasters,
            metrics,
            gate: None,
            skip_copies: false,
        }
    }

    /// The same processor, bringing every event to its current version with `upcasters`
    /// before the handler sees it (payload rewritten, `schema_version` set to the current one).
    /// They replace the handler's own ([`Handler::upcasters`]).
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
    /// through `gate`: a version applied already is skipped as a duplicate; one that comes
    /// before its predecessor is held in the database (acknowledged to the broker, counted,
    /// with its reason) and applied once the predecessor is. Events without an aggregate
    /// version pass. Only for a consumer that receives *every* event of the aggregates it
    /// handles: one filtered by event type sees gaps that never fill.
    pub fn with_version_gate(self, gate: VersionGate) -> Self {
        Self {
            gate: Some(gate.start()),
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

    /// The consumer name.
    pub fn name(&self) -> &str {
        &self.name
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

    /// Applies `message` in one transaction: inbox check, version gate (when set), handler
    /// (when new and its turn), commit; or holds it (see [`Outcome::Held`]). Any error rolls
    /// the transaction back before it returns. A message that cannot be decoded or upcast is
    /// a permanent failure ([`HandlerError::is_permanent`]); a handler that panics fails this
    /// message like an `Err`; a database outage comes back as an error with
    /// [`HandlerError::is_infrastructure`] set.
    ///
    /// Held events are applied by a runner (its drain, when their turn comes); a program that
    /// calls this directly runs a runner beside it, or applies them with the same consumer
    /// name through one.
    pub async fn apply(&self, message: &Message) -> Result<Outcome, HandlerError> {
        let event = message
            .decode()
            .map_err(|e| HandlerError::permanent(e.to_string()))
            .and_then(|event| {
                self.upcast(event)
                    .map_err(|e| HandlerError::permanent(e.to_string()))
            })?;
        self.deliver(message, &event).await.map(|d| d.outcome)
    }

    /// Counts one `count` for this consumer.
    pub(crate) fn count(&self, count: Count) {
        self.counts.add(count);
    }

    pub(crate) fn counts(&self) -> &Counts {
        &self.counts
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(crate) fn store(&self) -> Store<'_> {
        Store {
            sql: &self.sql,
            consumer: &self.name,
        }
    }

    /// Applies (or holds) a decoded delivery, `message` as received. Counted.
    pub(crate) async fn deliver(
        &self,
        message: &Message,
        event: &Envelope,
    ) -> Result<Delivered, HandlerError> {
        if self.skip_copies && event.copy_of_schema_version.is_some() {
            self.counts.add(Count::CopiesSkipped);
            return Ok(Delivered {
                outcome: Outcome::CopySkipped,
                drain: None,
            });
        }
        let started = Instant::now();
        let result = self
            .without_conflicts(|| self.deliver_once(message, event))
            .await;
        self.counts.observe_handler(started.elapsed().as_secs_f64());
        self.count_result(result.as_ref().map(|d| d.outcome));
        result
    }

    /// Counts how an attempt ended.
    pub(crate) fn count_result(&self, result: Result<Outcome, &HandlerError>) {
        let count = match result {
            Ok(Outcome::Applied) => Count::Handled,
            Ok(Outcome::Duplicate) => Count::Duplicates,
            Ok(Outcome::CopySkipped) => Count::CopiesSkipped,
            Ok(Outcome::Held) => Count::Held,
            Err(e) if e.is_infrastructure() => Count::InfrastructureFailures,
            Err(_) => Count::Failures,
        };
        self.counts.add(count);
    }

    /// Runs `attempt` again while it meets a concurrent first event of its aggregate (a
    /// conflict on the aggregate's new state row), at most [`CONFLICT_RETRIES`] times.
    pub(crate) async fn without_conflicts<T, F, Fut>(
        &self,
        mut attempt: F,
    ) -> Result<T, HandlerError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, HandlerError>>,
    {
        let mut tries = 0;
        loop {
            match attempt().await {
                Err(e) if e.is_conflict() && tries < CONFLICT_RETRIES => tries += 1,
                Err(e) if e.is_conflict() => return Err(HandlerError::new(e.message())),
                other => return other,
            }
        }
    }

    async fn deliver_once(
        &self,
        message: &Message,
        event: &Envelope,
    ) -> Result<Delivered, HandlerError> {
        let event = &self.current(event)?;
        let aggregate = Aggregate::of(event);
        let gated = self
            .gate
            .as_ref()
            .filter(|_| aggregate.is_some() && event.aggregate_version.is_some());
        let store = self.store();
        let mut tx = self.pool.begin().await?;
        let result = async {
            let (new, state, xact) = store.admit(&mut tx, event).await?;
            if !new {
                return Ok(None);
            }
            match decide::live(gated, &state, event.aggregate_version) {
                decide::Decision::Apply => {
                    self.run_handler(&mut tx, event).await?;
                    match (gated, &aggregate, event.aggregate_version) {
                        (Some(_), Some(aggregate), Some(version)) => {
                            if !store
                                .advance(&mut tx, aggregate, state.known, version, &xact)
                                .await?
                            {
                                return Err(HandlerError::conflict());
                            }
                        }
                        // No statement of the gate follows the handler: one that ignored an
                        // error, or ended the transaction, would otherwise count as applied.
                        _ => store.still_open(&mut tx, &xact).await?,
                    }
                    Ok(Some(Delivered {
                        outcome: Outcome::Applied,
                        drain: None,
                    }))
                }
                decide::Decision::Hold { due_in, reason } => {
                    let hold = Hold {
                        due_in,
                        attempts: 0,
                        last_error: None,
                        reason: &reason,
                    };
                    if !store
                        .hold(&mut tx, message, event, state.known, hold)
                        .await?
                    {
                        return Err(HandlerError::conflict());
                    }
                    if due_in.is_none() && gated.is_some() {
                        self.counts.add(Count::OutOfOrder);
                    }
                    Ok(Some(Delivered {
                        outcome: Outcome::Held,
                        drain: due_in.and(aggregate.clone()),
                    }))
                }
                decide::Decision::Stale => Ok(None),
                decide::Decision::BelowStart(why) => Err(HandlerError::below_start(why)),
                decide::Decision::Wait(why) => {
                    unreachable!("a delivery is never told to wait: {why}")
                }
            }
        }
        .await;
        match result {
            Ok(Some(delivered)) => {
                tx.commit().await?;
                Ok(delivered)
            }
            Ok(None) => {
                tx.rollback().await?;
                Ok(Delivered {
                    outcome: Outcome::Duplicate,
                    drain: None,
                })
            }
            Err(e) => {
                // Rolled back now, not when the pooled connection is next used: until then
                // its locks (the inbox row, the aggregate's state row) would hold back the
                // redelivery.
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }

    /// Holds a delivery whose first attempt failed (or that the broker delivered again: its
    /// tries are counted from here), to be tried when `hold.due_in` has passed. `Ok(false)`:
    /// the inbox had it (applied, or held, meanwhile): nothing to hold.
    pub(crate) async fn park(
        &self,
        message: &Message,
        event: &Envelope,
        hold: &Hold<'_>,
    ) -> Result<bool, HandlerError> {
        self.without_conflicts(|| async {
            let store = self.store();
            let mut tx = self.pool.begin().await?;
            let (new, state, _) = match store.admit(&mut tx, event).await {
                Ok(admitted) => admitted,
                Err(e) => {
                    let _ = tx.rollback().await;
                    return Err(e);
                }
            };
            if !new {
                tx.rollback().await?;
                return Ok(false);
            }
            let held = Hold {
                due_in: hold.due_in,
                attempts: hold.attempts,
                last_error: hold.last_error,
                reason: hold.reason,
            };
            match store.hold(&mut tx, message, event, state.known, held).await {
                Ok(true) => {
                    tx.commit().await?;
                    self.counts.add(Count::Held);
                    Ok(true)
                }
                Ok(false) => {
                    let _ = tx.rollback().await;
                    Err(HandlerError::conflict())
                }
                Err(e) => {
                    let _ = tx.rollback().await;
                    Err(e)
                }
            }
        })
        .await
    }

    /// A delivery of `event` is given up before anything held it: when it is the one its
    /// aggregate would start with now (the gate lets it through and nothing of the aggregate
    /// is applied), the aggregate starts no later than its version, so that it waits for the
    /// replay instead of starting past it. An event the gate would hold (a later version, a
    /// first-seen aggregate still settling) leaves the start where it is.
    pub(crate) async fn keep_start(&self, event: &Envelope) -> Result<(), HandlerError> {
        let (Some(start), Some(aggregate), Some(version)) =
            (&self.gate, Aggregate::of(event), event.aggregate_version)
        else {
            return Ok(());
        };
        let store = self.store();
        let mut tx = self.pool.begin().await?;
        let state = store
            .lock_state(&mut tx, &aggregate)
            .await?
            .unwrap_or_default();
        if state.version.is_none()
            && decide::live(Some(start), &state, Some(version)) == decide::Decision::Apply
        {
            store.keep_start(&mut tx, &aggregate, version).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// `event` upcast to its current version, if it is not (a no-op for events upcast on
    /// receipt).
    pub(crate) fn current(&self, event: &Envelope) -> Result<Envelope, HandlerError> {
        match self.upcasters.to_current(event) {
            Ok(event) => Ok(event.into_owned()),
            Err(e) => {
                if matches!(e, UpcastError::Panicked { .. }) {
                    self.counts.add(Count::Panics);
                }
                Err(HandlerError::permanent(e.to_string()))
            }
        }
    }

    /// The handler in `tx`; a panic is this message's failure.
    pub(crate) async fn run_handler(
        &self,
        tx: &mut PgConnection,
        event: &Envelope,
    ) -> Result<(), HandlerError> {
        match AssertUnwindSafe(self.handler.handle(tx, event))
            .catch_unwind()
            .await
        {
            Ok(result) => {
                // An upcaster's panic inside a typed handler, caught where it ran.
                if matches!(&result, Err(e) if e.is_upcast_panic()) {
                    self.counts.add(Count::Panics);
                }
                result
            }
            Err(panic) => {
                self.counts.add(Count::Panics);
                Err(HandlerError::new(format!(
                    "handler {}",
                    crate::panic::message(panic)
                )))
            }
        }
    }
}
