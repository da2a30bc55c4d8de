//! The order as every service sees it, the events that carry it, and the mix of orders a run
//! places (some with a declined card, some for an item that never comes back in stock).

use outbox::{postgres::PgOutbox, Event, Outbox};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use crate::BoxError;

/// Every event of the flow carries the whole ticket: each service copies it into its reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ticket {
    /// The order id (the correlation id and the aggregate id of every event).
    pub order_id: i64,
    /// What is ordered.
    pub sku: String,
    /// How many.
    pub qty: i64,
    /// Price in cents.
    pub amount: i64,
    /// The card to charge; [`DECLINED_CARD`] is refused by the payment service.
    pub card: String,
}

/// A card the payment service declines: the order is compensated (inventory released, order
/// cancelled).
pub const DECLINED_CARD: &str = "4000-0000-0000-0002";
/// An item out of stock with a supplier that never answers: the inventory service puts the
/// order on back-order and says nothing, so the saga's inventory deadline cancels it.
pub const BACKORDER_SKU: &str = "rare-vinyl";
/// Items in stock, with their starting quantity.
pub const STOCKED: &[(&str, i64)] = &[("apple", 1_000_000), ("pear", 1_000_000)];

/// Which way the services coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A saga orchestrator sends commands and reacts to replies.
    Orchestrated,
    /// Each service reacts to the others' events; no one is in charge.
    Choreographed,
}

impl Ticket {
    /// The `n`th order of a run: every 10th has a declined card (payment fails), every 10th
    /// (offset 7) is for the back-ordered item (inventory times out).
    pub fn nth(order_id: i64, n: i64) -> Self {
        let sku = match n % 10 {
            7 => BACKORDER_SKU,
            k => STOCKED[k as usize % STOCKED.len()].0,
        };
        Self {
            order_id,
            sku: sku.into(),
            qty: 1 + n % 3,
            amount: 1_990 + 100 * (n % 7),
            card: if n % 10 == 3 {
                DECLINED_CARD.into()
            } else {
                format!("4242-{n:04}")
            },
        }
    }

    /// An event of type `event_type` about this order, carrying the ticket.
    pub fn event(&self, event_type: &str) -> Event {
        Event::new("order", self.order_id.to_string(), event_type)
            .json(self)
            .expect("a ticket serialises")
    }

    /// Enqueues `event_type` in the caller's transaction.
    pub async fn send(
        &self,
        outbox: &PgOutbox,
        conn: &mut PgConnection,
        event_type: &str,
    ) -> Result<(), outbox::Error> {
        outbox
            .enqueue(conn, &self.event(event_type))
            .await
            .map(|_| ())
    }
}

/// The order service takes an order: the row and `OrderCreated` commit together.
pub async fn place_order(
    pool: &sqlx::PgPool,
    outbox: &PgOutbox,
    n: i64,
    inventory_deadline_secs: f64,
) -> Result<i64, BoxError> {
    let mut tx = pool.begin().await?;
    let order_id: i64 = sqlx::query_scalar(&outbox.tables().render(
        "INSERT INTO {schema}.orders (status, deadline) \
         VALUES ('pending', now() + make_interval(secs => $1)) RETURNING id",
    ))
    .bind(inventory_deadline_secs)
    .fetch_one(&mut *tx)
    .await?;
    let ticket = Ticket::nth(order_id, n);
    sqlx::query(&outbox.tables().render(
        "UPDATE {schema}.orders SET sku = $2, qty = $3, amount = $4, card = $5 WHERE id = $1",
    ))
    .bind(order_id)
    .bind(&ticket.sku)
    .bind(ticket.qty)
    .bind(ticket.amount)
    .bind(&ticket.card)
    .execute(&mut *tx)
    .await?;
    ticket.send(outbox, &mut tx, "OrderCreated").await?;
    tx.commit().await?;
    Ok(order_id)
}

/// Creates the services' tables next to the outbox. `applied_log` has no unique key: it
/// records every application of every event by every service, so a double one would show.
pub async fn install(pool: &sqlx::PgPool, tables: &outbox::Tables) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(&tables.render(
        "CREATE TABLE {schema}.orders (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             sku text, qty bigint, amount bigint, card text,
             status text NOT NULL,            -- pending | awaiting_payment | completed | cancelled
             deadline timestamptz);           -- choreography: when a pending order is given up
         CREATE TABLE {schema}.stock (sku text PRIMARY KEY, available bigint NOT NULL);
         CREATE TABLE {schema}.initial_stock (sku text PRIMARY KEY, initial bigint NOT NULL);
         CREATE TABLE {schema}.reservations (
             order_id bigint PRIMARY KEY, sku text NOT NULL, qty bigint NOT NULL,
             status text NOT NULL);           -- reserved | backordered | refused | released
         CREATE TABLE {schema}.payments (order_id bigint PRIMARY KEY, amount bigint NOT NULL,
                                         status text NOT NULL);   -- charged | declined
         CREATE TABLE {schema}.shipments (order_id bigint PRIMARY KEY);
         CREATE TABLE {schema}.applied_log (consumer text NOT NULL, event_id uuid NOT NULL);",
    ))
    .execute(pool)
    .await?;
    for (sku, available) in STOCKED.iter().chain([(BACKORDER_SKU, 0)].iter()) {
        sqlx::query(&tables.render("INSERT INTO {schema}.stock (sku, available) VALUES ($1, $2)"))
            .bind(sku)
            .bind(available)
            .execute(pool)
            .await?;
    }
    sqlx::raw_sql(
        &tables
            .render("INSERT INTO {schema}.initial_stock SELECT sku, available FROM {schema}.stock"),
    )
    .execute(pool)
    .await?;
    Ok(())
}
