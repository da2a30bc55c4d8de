//! The four services of the flow as consumers. Each applies an event once (the inbox) and emits
//! its reply through the outbox in the same transaction. The same services serve both modes:
//! orchestrated, they obey the saga's commands; choreographed, they react to each other's
//! events.

use futures::future::BoxFuture;
use outbox::{postgres::PgOutbox, Tables};
use outbox_consumer::{Envelope, Handler, HandlerError};
use sqlx::PgConnection;

use super::ticket::{Mode, Ticket, BACKORDER_SKU, DECLINED_CARD};

/// Which service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// Reserves and releases stock.
    Inventory,
    /// Charges cards.
    Payment,
    /// Ships.
    Shipping,
    /// Owns the order's status.
    Orders,
}

impl Service {
    /// All four.
    pub const ALL: [Service; 4] = [
        Service::Inventory,
        Service::Payment,
        Service::Shipping,
        Service::Orders,
    ];

    /// The consumer name.
    pub fn name(self) -> &'static str {
        match self {
            Service::Inventory => "inventory",
            Service::Payment => "payment",
            Service::Shipping => "shipping",
            Service::Orders => "orders",
        }
    }
}

/// What a service does with one event.
#[derive(Clone, Copy, Debug)]
enum Action {
    Reserve,
    Release,
    Charge,
    Ship,
    /// Move the order from one of `from` to `to`, and emit `then` if it moved.
    Order {
        from: &'static [&'static str],
        to: &'static str,
        then: Option<&'static str>,
    },
}

fn action(service: Service, mode: Mode, event_type: &str) -> Option<Action> {
    use Mode::{Choreographed as C, Orchestrated as O};
    use Service::*;
    const OPEN: &[&str] = &["pending", "awaiting_payment"];
    Some(match (service, mode, event_type) {
        (Inventory, O, "ReserveInventory") | (Inventory, C, "OrderCreated") => Action::Reserve,
        (Inventory, O, "ReleaseInventory") | (Inventory, C, "OrderCancelled") => Action::Release,
        (Payment, O, "ProcessPayment") | (Payment, C, "PaymentRequested") => Action::Charge,
        (Shipping, O, "ShipOrder") | (Shipping, C, "PaymentSucceeded") => Action::Ship,
        (Orders, O, "CompleteOrder") => Action::Order {
            from: OPEN,
            to: "completed",
            then: None,
        },
        (Orders, O, "CancelOrder") => Action::Order {
            from: OPEN,
            to: "cancelled",
            then: None,
        },
        (Orders, C, "InventoryReserved") => Action::Order {
            from: &["pending"],
            to: "awaiting_payment",
            then: Some("PaymentRequested"),
        },
        (Orders, C, "InventoryRejected") => Action::Order {
            from: &["pending"],
            to: "cancelled",
            then: Some("OrderCancelled"),
        },
        // Compensation: the order is cancelled, and the inventory releases on OrderCancelled.
        (Orders, C, "PaymentFailed") => Action::Order {
            from: &["awaiting_payment"],
            to: "cancelled",
            then: Some("OrderCancelled"),
        },
        (Orders, C, "OrderShipped") => Action::Order {
            from: &["awaiting_payment"],
            to: "completed",
            then: None,
        },
        _ => return None,
    })
}

/// One service as a consumer [`Handler`].
pub struct ServiceHandler {
    service: Service,
    mode: Mode,
    outbox: PgOutbox,
    tables: Tables,
}

impl ServiceHandler {
    /// `service` in `mode`, with its tables and outbox in `tables`' schema.
    pub fn new(service: Service, mode: Mode, tables: &Tables) -> Self {
        Self {
            service,
            mode,
            outbox: PgOutbox::new(tables.clone()),
            tables: tables.clone(),
        }
    }

    async fn apply(&self, tx: &mut PgConnection, event: &Envelope) -> Result<(), HandlerError> {
        let Some(action) = action(self.service, self.mode, &event.event_type) else {
            return Ok(()); // not for this service
        };
        let ticket: Ticket = event.json()?;
        sqlx::query(
            &self
                .tables
                .render("INSERT INTO {schema}.applied_log (consumer, event_id) VALUES ($1, $2)"),
        )
        .bind(self.service.name())
        .bind(event.event_id)
        .execute(&mut *tx)
        .await?;
        match action {
            Action::Reserve => self.reserve(tx, &ticket).await,
            Action::Release => self.release(tx, &ticket).await,
            Action::Charge => {
                let declined = ticket.card == DECLINED_CARD;
                let status = if declined { "declined" } else { "charged" };
                sqlx::query(&self.tables.render(
                    "INSERT INTO {schema}.payments (order_id, amount, status) VALUES ($1, $2, $3)",
                ))
                .bind(ticket.order_id)
                .bind(ticket.amount)
                .bind(status)
                .execute(&mut *tx)
                .await?;
                let reply = if declined {
                    "PaymentFailed"
                } else {
                    "PaymentSucceeded"
                };
                Ok(ticket.send(&self.outbox, tx, reply).await?)
            }
            Action::Ship => {
                sqlx::query(
                    &self
                        .tables
                        .render("INSERT INTO {schema}.shipments (order_id) VALUES ($1)"),
                )
                .bind(ticket.order_id)
                .execute(&mut *tx)
                .await?;
                Ok(ticket.send(&self.outbox, tx, "OrderShipped").await?)
            }
            Action::Order { from, to, then } => {
                let moved = sqlx::query(&self.tables.render(
                    "UPDATE {schema}.orders SET status = $2 WHERE id = $1 AND status = ANY($3)",
                ))
                .bind(ticket.order_id)
                .bind(to)
                .bind(from)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                match then {
                    Some(next) if moved == 1 => Ok(ticket.send(&self.outbox, tx, next).await?),
                    _ => Ok(()),
                }
            }
        }
    }

    /// The order's reservation status, locked; `None` when there is none yet.
    async fn reservation(
        &self,
        tx: &mut PgConnection,
        t: &Ticket,
    ) -> Result<Option<String>, HandlerError> {
        Ok(sqlx::query_scalar(
            &self
                .tables
                .render("SELECT status FROM {schema}.reservations WHERE order_id = $1 FOR UPDATE"),
        )
        .bind(t.order_id)
        .fetch_optional(&mut *tx)
        .await?)
    }

    async fn record_reservation(
        &self,
        tx: &mut PgConnection,
        t: &Ticket,
        status: &str,
    ) -> Result<(), HandlerError> {
        sqlx::query(&self.tables.render(
            "INSERT INTO {schema}.reservations (order_id, sku, qty, status) VALUES ($1, $2, $3, $4)",
        ))
        .bind(t.order_id)
        .bind(&t.sku)
        .bind(t.qty)
        .bind(status)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    /// Reserves stock, refuses it, or back-orders it (and then stays silent). An order whose
    /// release arrived first (a tombstone) is refused.
    async fn reserve(&self, tx: &mut PgConnection, t: &Ticket) -> Result<(), HandlerError> {
        let existing = self.reservation(tx, t).await?;
        let (status, reply) = match existing.as_deref() {
            Some("released") => return Ok(t.send(&self.outbox, tx, "InventoryRejected").await?),
            Some(_) => return Ok(()), // already decided for this order
            None if t.sku == BACKORDER_SKU => ("backordered", None),
            None => {
                let taken = sqlx::query(&self.tables.render(
                    "UPDATE {schema}.stock SET available = available - $2 \
                     WHERE sku = $1 AND available >= $2",
                ))
                .bind(&t.sku)
                .bind(t.qty)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if taken == 1 {
                    ("reserved", Some("InventoryReserved"))
                } else {
                    ("refused", Some("InventoryRejected"))
                }
            }
        };
        self.record_reservation(tx, t, status).await?;
        if let Some(reply) = reply {
            t.send(&self.outbox, tx, reply).await?;
        }
        Ok(())
    }

    /// Gives reserved stock back. A release that arrives before its reservation leaves a
    /// tombstone, so the late reservation is refused: stock is never left reserved for a
    /// cancelled order, whatever order the two arrive in.
    async fn release(&self, tx: &mut PgConnection, t: &Ticket) -> Result<(), HandlerError> {
        let existing = self.reservation(tx, t).await?;
        match existing.as_deref() {
            Some("reserved") => {
                sqlx::query(
                    &self.tables.render(
                        "UPDATE {schema}.stock SET available = available + $2 WHERE sku = $1",
                    ),
                )
                .bind(&t.sku)
                .bind(t.qty)
                .execute(&mut *tx)
                .await?;
            }
            Some("backordered") => {}
            Some(_) => return Ok(()), // refused or released already: nothing held
            None => {
                self.record_reservation(tx, t, "released").await?;
                return Ok(());
            }
        }
        sqlx::query(
            &self
                .tables
                .render("UPDATE {schema}.reservations SET status = 'released' WHERE order_id = $1"),
        )
        .bind(t.order_id)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }
}

impl Handler for ServiceHandler {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(self.apply(tx, event))
    }
}

/// Choreography's timeout: the order service gives up on orders still pending past their
/// deadline, in one transaction per round: cancel them and emit `OrderCancelled` (the inventory
/// releases whatever it holds or back-ordered). Returns how many it cancelled.
pub async fn cancel_overdue(pool: &sqlx::PgPool, tables: &Tables) -> Result<usize, HandlerError> {
    let outbox = PgOutbox::new(tables.clone());
    let mut tx = pool.begin().await?;
    let overdue: Vec<(i64, String, i64, i64, String)> = sqlx::query_as(&tables.render(
        "UPDATE {schema}.orders SET status = 'cancelled' WHERE id IN (
             SELECT id FROM {schema}.orders WHERE status = 'pending' AND deadline <= now()
             ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
         RETURNING id, sku, qty, amount, card",
    ))
    .fetch_all(&mut *tx)
    .await?;
    for (order_id, sku, qty, amount, card) in &overdue {
        let ticket = Ticket {
            order_id: *order_id,
            sku: sku.clone(),
            qty: *qty,
            amount: *amount,
            card: card.clone(),
        };
        ticket.send(&outbox, &mut tx, "OrderCancelled").await?;
    }
    tx.commit().await?;
    Ok(overdue.len())
}
