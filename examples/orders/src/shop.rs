//! The shop on PostgreSQL: tables, the order service, and the two consumers' handlers.

use futures::future::BoxFuture;
use outbox::{postgres::PgOutbox, Event, Tables};
use outbox_consumer::{Envelope, Handler, HandlerError};
use sqlx::{PgConnection, PgPool};

/// Products and their starting stock.
pub const PRODUCTS: &[(&str, i64)] = &[("apple", 100_000), ("pear", 100_000), ("plum", 100_000)];

/// Creates the shop's tables next to the outbox (same schema). `applied_log` has no unique key:
/// it records every application, so a double one would show.
pub async fn install(pool: &PgPool, tables: &Tables) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(&tables.render(
        "CREATE TABLE {schema}.orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                                       customer text NOT NULL, sku text NOT NULL,
                                       qty int NOT NULL);
         CREATE TABLE {schema}.stock (sku text PRIMARY KEY, available bigint NOT NULL,
                                      reserved bigint NOT NULL DEFAULT 0);
         CREATE TABLE {schema}.notifications (order_id bigint NOT NULL, message text NOT NULL);
         CREATE TABLE {schema}.applied_log (consumer text NOT NULL, event_id uuid NOT NULL);",
    ))
    .execute(pool)
    .await?;
    for (sku, available) in PRODUCTS {
        sqlx::query(&tables.render("INSERT INTO {schema}.stock (sku, available) VALUES ($1, $2)"))
            .bind(sku)
            .bind(available)
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// The order service: the order and its `OrderCreated` event commit together.
pub async fn place_order(
    pool: &PgPool,
    outbox: &PgOutbox,
    n: i64,
) -> Result<uuid::Uuid, Box<dyn std::error::Error + Send + Sync>> {
    let (sku, _) = PRODUCTS[n as usize % PRODUCTS.len()];
    let qty = 1 + (n % 3) as i32;
    let customer = format!("customer-{}", n % 37);
    let mut tx = pool.begin().await?;
    let id: i64 = sqlx::query_scalar(&outbox.tables().render(
        "INSERT INTO {schema}.orders (customer, sku, qty) VALUES ($1, $2, $3) RETURNING id",
    ))
    .bind(&customer)
    .bind(sku)
    .bind(qty)
    .fetch_one(&mut *tx)
    .await?;
    let event = Event::new("order", id.to_string(), "OrderCreated")
        .json(&serde_json::json!({ "order_id": id, "customer": customer, "sku": sku, "qty": qty }))?
        .aggregate_version(1);
    let event_id = outbox.enqueue(&mut tx, &event).await?;
    tx.commit().await?;
    Ok(event_id)
}

/// Reserves the ordered quantity, once per order.
pub struct Inventory {
    reserve: String,
    log: String,
}

/// Sends the customer a confirmation, once per order.
pub struct Notifications {
    notify: String,
    log: String,
}

fn log_sql(tables: &Tables) -> String {
    tables.render("INSERT INTO {schema}.applied_log (consumer, event_id) VALUES ($1, $2)")
}

impl Inventory {
    /// The handler for the shop in `tables`' schema.
    pub fn new(tables: &Tables) -> Self {
        Self {
            reserve: tables.render(
                "UPDATE {schema}.stock SET available = available - $2, reserved = reserved + $2 \
                 WHERE sku = $1",
            ),
            log: log_sql(tables),
        }
    }
}

impl Notifications {
    /// The handler for the shop in `tables`' schema.
    pub fn new(tables: &Tables) -> Self {
        Self {
            notify: tables
                .render("INSERT INTO {schema}.notifications (order_id, message) VALUES ($1, $2)"),
            log: log_sql(tables),
        }
    }
}

impl Handler for Inventory {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let body: serde_json::Value = event.json()?;
            sqlx::query(&self.reserve)
                .bind(body["sku"].as_str().unwrap_or_default())
                .bind(body["qty"].as_i64().unwrap_or_default())
                .execute(&mut *tx)
                .await?;
            sqlx::query(&self.log)
                .bind("inventory")
                .bind(event.event_id)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}

impl Handler for Notifications {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let body: serde_json::Value = event.json()?;
            let order_id = body["order_id"].as_i64().unwrap_or_default();
            sqlx::query(&self.notify)
                .bind(order_id)
                .bind(format!(
                    "Thanks {}, your order #{order_id} is confirmed",
                    body["customer"].as_str().unwrap_or("customer")
                ))
                .execute(&mut *tx)
                .await?;
            sqlx::query(&self.log)
                .bind("notifications")
                .bind(event.event_id)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}
