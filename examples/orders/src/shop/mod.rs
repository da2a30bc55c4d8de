//! The shop: an order service that writes each order and its `OrderCreated` event in one
//! transaction, and two consumers (inventory, notifications) that apply each event once. The
//! statements are the same on PostgreSQL, MySQL/MariaDB and SQLite up to their dialect
//! ([`Statements`]), and bound in the same order on all three.

#[cfg(feature = "brokers")]
mod handlers;
mod statements;
mod storage;

#[cfg(feature = "brokers")]
pub use handlers::{Inventory, Notifications};
pub use statements::{Dialect, Statements};
pub use storage::Storage;

use outbox::Event;
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

    /// Its `OrderCreated` event, version 1 of aggregate `order/{id}`.
    pub fn created(&self) -> Result<Event, outbox::Error> {
        Ok(Event::new("order", self.id.to_string(), "OrderCreated")
            .json(&serde_json::json!({
                "order_id": self.id,
                "customer": self.customer,
                "sku": self.sku,
                "qty": self.qty,
            }))?
            .aggregate_version(1))
    }
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

/// Applies `OrderCreated` (its JSON `body`) for `consumer` on `conn`, inside the caller's
/// transaction, and logs the application: inventory reserves the stock, notifications writes
/// the customer's confirmation.
pub async fn apply<DB>(
    conn: &mut DB::Connection,
    sql: &Statements,
    consumer: &str,
    event_id: uuid::Uuid,
    body: &serde_json::Value,
) -> Result<(), sqlx::Error>
where
    DB: Database,
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
{
    let order_id = body["order_id"].as_i64().unwrap_or_default();
    if consumer == "inventory" {
        let qty = body["qty"].as_i64().unwrap_or_default();
        sqlx::query::<DB>(&sql.reserve)
            .bind(qty)
            .bind(qty)
            .bind(body["sku"].as_str().unwrap_or_default().to_owned())
            .execute(&mut *conn)
            .await?;
    } else {
        let customer = body["customer"].as_str().unwrap_or("customer");
        sqlx::query::<DB>(&sql.notify)
            .bind(order_id)
            .bind(format!(
                "Thanks {customer}, your order #{order_id} is confirmed"
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
