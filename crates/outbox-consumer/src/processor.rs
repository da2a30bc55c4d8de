use std::sync::Arc;

use outbox::postgres::{PgInbox, Seen};
use sqlx::PgPool;

use crate::{Envelope, Handler, HandlerError};

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
        }
    }

    /// The consumer name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// In one transaction: inbox check, handler (when new), commit.
    pub async fn apply(&self, event: &Envelope) -> Result<Outcome, HandlerError> {
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
