//! The two consumers as typed handlers of `outbox-consumer`'s runners (PostgreSQL): the runner
//! records the event in the inbox, decodes it into [`OrderCreated`] and the handler applies it
//! in the same transaction.

use outbox_consumer::{Envelope, Handle, HandlerError, Handlers};
use sqlx::{PgConnection, Postgres};

use super::{apply, OrderCreated, Statements};

/// Reserves the ordered quantity, once per order.
pub struct Inventory(Statements);

/// Sends the customer a confirmation, once per order.
pub struct Notifications(Statements);

impl Inventory {
    /// The handler for the shop of `sql`.
    pub fn new(sql: &Statements) -> Self {
        Self(sql.clone())
    }
}

impl Notifications {
    /// The handler for the shop of `sql`.
    pub fn new(sql: &Statements) -> Self {
        Self(sql.clone())
    }
}

impl Handle<OrderCreated> for Inventory {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        order: OrderCreated,
        envelope: &Envelope,
    ) -> Result<(), HandlerError> {
        apply::<Postgres>(tx, &self.0, "inventory", envelope.event_id, &order).await?;
        Ok(())
    }
}

impl Handle<OrderCreated> for Notifications {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        order: OrderCreated,
        envelope: &Envelope,
    ) -> Result<(), HandlerError> {
        apply::<Postgres>(tx, &self.0, "notifications", envelope.event_id, &order).await?;
        Ok(())
    }
}

/// Consumer `name`'s handlers: `OrderCreated` only; any other event type is dead-lettered.
pub fn handlers(name: &str, sql: &Statements) -> Handlers {
    match name {
        "inventory" => Handlers::new().on::<OrderCreated>(Inventory::new(sql)),
        _ => Handlers::new().on::<OrderCreated>(Notifications::new(sql)),
    }
}
