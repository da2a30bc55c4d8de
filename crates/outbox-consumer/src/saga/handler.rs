//! The saga as a consumer [`Handler`]: the [`Processor`](crate::Processor) runs it inside the
//! inbox transaction, so inbox dedupe and the whole step commit together.

use std::sync::Arc;

use futures::future::BoxFuture;
use outbox::Tables;
use sqlx::{PgConnection, PgPool};

use super::{
    definition::{Saga, Trigger},
    runtime::{Outcome, Runtime},
    timeouts::SagaTimeouts,
};
use crate::{Envelope, Handler, HandlerError};

/// Runs a [`Saga`]'s steps for the events a consumer receives.
///
/// ```no_run
/// # use outbox_consumer::{saga::{Saga, SagaHandler}, Processor};
/// # fn demo<S: Saga>(pool: sqlx::PgPool, tables: outbox::Tables, my_saga: S) {
/// let saga = SagaHandler::new(my_saga, &tables);
/// let timeouts = saga.timeouts(pool.clone()); // run it: timeouts.run(stop).await
/// let processor = Processor::new(pool, &tables, "order-saga", std::sync::Arc::new(saga));
/// # }
/// ```
pub struct SagaHandler<S: Saga> {
    runtime: Arc<Runtime<S>>,
}

impl<S: Saga> SagaHandler<S> {
    /// The handler for `saga`, with its instances in `tables`' schema (the `sagas` and
    /// `saga_steps` tables, created by the outbox migrations).
    pub fn new(saga: S, tables: &Tables) -> Self {
        Self {
            runtime: Arc::new(Runtime::new(Arc::new(saga), tables)),
        }
    }

    /// The scheduler that fires this saga's deadlines through the same step machinery.
    pub fn timeouts(&self, pool: PgPool) -> SagaTimeouts<S> {
        SagaTimeouts::new(pool, self.runtime.clone())
    }

    /// Runs one step for `event` in the caller's transaction and says how it ended. `None`
    /// when the saga does not handle this event type. An error rolls the step back: the
    /// event has no instance yet, `react` found it unexpected, `start` or `react` failed, or
    /// the database did.
    pub async fn step(
        &self,
        conn: &mut PgConnection,
        event: &Envelope,
    ) -> Result<Option<Outcome>, HandlerError> {
        let rt = &*self.runtime;
        let saga = &*rt.saga;
        if !saga.reacts_to().contains(&event.event_type.as_str()) {
            return Ok(None);
        }
        let trigger = Trigger::Event(event);
        let Some(correlation_id) = saga.correlate(event).filter(|c| !c.is_empty()) else {
            tracing::warn!(saga = saga.name(), event_id = %event.event_id,
                event_type = %event.event_type, "saga event without a correlation id");
            rt.record(
                conn,
                "",
                &trigger,
                None,
                None,
                Outcome::Uncorrelated,
                &[],
                None,
            )
            .await?;
            return Ok(Some(Outcome::Uncorrelated));
        };
        if let Some(instance) = rt.load(conn, &correlation_id).await? {
            return rt
                .step(conn, &correlation_id, instance, &trigger)
                .await
                .map(Some);
        }
        match saga.start(event)? {
            Some(start) => rt
                .start(conn, &correlation_id, start, &trigger)
                .await
                .map(Some),
            None => {
                // Perhaps it overtook the event that starts the instance: retried, then
                // dead-lettered, never dropped.
                tracing::warn!(saga = saga.name(), correlation_id, event_id = %event.event_id,
                    event_type = %event.event_type, "saga event for no instance yet; retried");
                Err(HandlerError::new(format!(
                    "saga {} {correlation_id:?}: no instance yet, and {} does not start one",
                    saga.name(),
                    event.event_type
                )))
            }
        }
    }
}

impl<S: Saga> Handler for SagaHandler<S> {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move { self.step(tx, event).await.map(|_| ()) })
    }
}
