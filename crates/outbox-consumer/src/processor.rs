use std::sync::Arc;

use outbox::postgres::{PgInbox, Seen};
use sqlx::PgPool;

use crate::{Envelope, Handler, HandlerError, UpcastError, Upcasters};

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
        }
    }

    /// The same processor, bringing every event to its current version with `upcasters`
    /// before the handler sees it (payload rewritten, `schema_version` set to the current one).
    pub fn with_upcasters(self, upcasters: Upcasters) -> Self {
        Self { upcasters, ..self }
    }

    /// The event as the handler will see it. Runners call this right after decoding, and
    /// dead-letter the message at once on an error (it cannot succeed on a retry).
    pub fn upcast(&self, event: Envelope) -> Result<Envelope, UpcastError> {
        self.upcasters.upcast_envelope(event)
    }

    /// The consumer name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// In one transaction: inbox check, handler (when new), commit. The event is upcast first
    /// (a no-op when it is already current, as after [`Processor::upcast`]).
    pub async fn apply(&self, event: &Envelope) -> Result<Outcome, HandlerError> {
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
        self.handler.handle(&mut tx, event).await?;
        tx.commit().await?;
        Ok(Outcome::Applied)
    }
}
