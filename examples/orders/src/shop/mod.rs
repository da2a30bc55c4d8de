//! The shop: an order service that writes each order and its `OrderCreated` event in one
//! transaction, and two consumers (inventory, notifications) that apply each event once. The
//! statements are the same on PostgreSQL, MySQL/MariaDB and SQLite up to their dialect
//! ([`Statements`]), and bound in the same order on all three.

#[cfg(feature = "brokers")]
mod handlers;
mod statements;
mod storage;

#[cfg(feature = "brokers")]
pub use handlers::{handlers, Inventory, Notifications};
pub use statements::{Dialect, Statements};
pub use storage::Storage;

use outbox::DomainEvent;
use serde::{Deserialize, Serialize};
use sqlx::{Database, Encode, Executor, IntoArguments, Type};

/// Products and their starting stock.
pub const PRODUCTS: &[(&str, i64)] = &[("apple", 100_000), ("pear", 100_000), ("plum", 100_000)];

/// The two consumers of `OrderCreated`.
pub const CONSUMERS: &[&str] = &["inventory", "notifications"];

/// The `n`-th order of a run (from 0): the order service picks its id, so the statements need
/// no `RETURNING`, which MySQL lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    /// `n + 1`.
    pub id: i64,
    /// One of 37 customers.
    pub customer: String,
    /// One of [`PRODUCTS`].
    pub sku: &'static str,
    /// 1 to 3 units.
    pub qty: i64,
}

impl Order {
    /// The `n`-th order.
    pub fn nth(n: i64) -> Self {
        Self {
            id: n + 1,
            customer: format!("customer-{}", n % 37),
            sku: PRODUCTS[n as usize % PRODUCTS.len()].0,
            qty: 1 + n % 3,
        }
    }

    /// Its `OrderCreated` event.
    pub fn created(&self) -> OrderCreated {
        OrderCreated {
            order_id: self.id,
            customer: self.customer.clone(),
            sku: self.sku.to_owned(),
            qty: self.qty,
        }
    }
}

/// The event the order service publishes with each order, and what both consumers apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderCreated {
    /// The order's id, also its aggregate id.
    pub order_id: i64,
    /// Who ordered.
    pub customer: String,
    /// One of [`PRODUCTS`].
    pub sku: String,
    /// Units ordered.
    pub qty: i64,
}

impl DomainEvent for OrderCreated {
    const AGGREGATE_TYPE: &'static str = "order";
    const EVENT_TYPE: &'static str = "OrderCreated";
}

/// Inserts `order` on `conn` (inside the caller's transaction).
pub async fn insert_order<DB>(
    conn: &mut DB::Connection,
    sql: &Statements,
    order: &Order,
) -> Result<(), sqlx::Error>
where
    DB: Database,
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
{
    sqlx::query::<DB>(&sql.insert_order)
        .bind(order.id)
        .bind(order.customer.clone())
        .bind(order.sku.to_owned())
        .bind(order.qty)
        .execute(conn)
        .await?;
    Ok(())
}

/// Applies `order` for `consumer` on `conn`, inside the caller's transaction, and logs the
/// application: inventory reserves the stock, notifications writes the customer's confirmation.
pub async fn apply<DB>(
    conn: &mut DB::Connection,
    sql: &Statements,
    consumer: &str,
    event_id: uuid::Uuid,
    order: &OrderCreated,
) -> Result<(), sqlx::Error>
where
    DB: Database,
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
{
    if consumer == "inventory" {
        sqlx::query::<DB>(&sql.reserve)
            .bind(order.qty)
            .bind(order.qty)
            .bind(order.sku.clone())
            .execute(&mut *conn)
            .await?;
    } else {
        sqlx::query::<DB>(&sql.notify)
            .bind(order.order_id)
            .bind(format!(
                "Thanks {}, your order #{} is confirmed",
                order.customer, order.order_id
            ))
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query::<DB>(&sql.log)
        .bind(consumer.to_owned())
        .bind(event_id.hyphenated().to_string())
        .execute(conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_cycle_through_products_customers_and_quantities() {
        assert_eq!(
            Order::nth(0),
            Order {
                id: 1,
                customer: "customer-0".into(),
                sku: "apple",
                qty: 1
            }
        );
        assert_eq!(Order::nth(40).customer, "customer-3");
        assert_eq!(Order::nth(4).sku, "pear");
        assert_eq!(Order::nth(5).qty, 3);
    }
}
