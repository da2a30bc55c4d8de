//! The two consumers as handlers of `outbox-consumer`'s runners (PostgreSQL): the runner records
//! the event in the inbox, the handler applies it in the same transaction.

use futures::future::BoxFuture;
use outbox_consumer::{Envelope, Handler, HandlerError};
use sqlx::{PgConnection, Postgres};

use super::{apply, Statements};

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

/// Applies `event` for `consumer`.
fn handle<'a>(
    sql: &'a Statements,
    consumer: &'static str,
    tx: &'a mut PgConnection,
    event: &'a Envelope,
) -> BoxFuture<'a, Result<(), HandlerError>> {
    Box::pin(async move {
        let body: serde_json::Value = event.json()?;
        apply::<Postgres>(tx, sql, consumer, event.event_id, &body).await?;
        Ok(())
    })
}

impl Handler for Inventory {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        handle(&self.0, "inventory", tx, event)
    }
}

impl Handler for Notifications {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        handle(&self.0, "notifications", tx, event)
    }
}
