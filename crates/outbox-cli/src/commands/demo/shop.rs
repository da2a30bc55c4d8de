//! The demo's shop on SQLite: an order service that writes each order and its `OrderCreated`
//! event in one transaction, and two consumers (inventory, notifications) that apply each event
//! once through the inbox.

use outbox::{sqlite::SqliteInbox, sqlite::SqliteOutbox, Event, Seen};
use sqlx::{Executor, SqliteConnection, SqlitePool};
use uuid::Uuid;

/// Products the shop sells, with their starting stock.
pub const PRODUCTS: &[(&str, i64)] = &[("apple", 100_000), ("pear", 100_000), ("plum", 100_000)];

/// The two consumers of `OrderCreated`.
pub const CONSUMERS: &[&str] = &["inventory", "notifications"];

/// Creates the shop's tables. `applied_log` has no unique key on purpose: it records every
/// application, so the summary can prove none happened twice.
pub async fn install(pool: &SqlitePool) -> Result<(), sqlx::Error> {
    pool.execute(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, sku TEXT NOT NULL,
                              qty INTEGER NOT NULL);
         CREATE TABLE stock (sku TEXT PRIMARY KEY, available INTEGER NOT NULL,
                             reserved INTEGER NOT NULL DEFAULT 0);
         CREATE TABLE notifications (order_id INTEGER NOT NULL, message TEXT NOT NULL);
         CREATE TABLE applied_log (consumer TEXT NOT NULL, event_id TEXT NOT NULL);",
    )
    .await?;
    for (sku, available) in PRODUCTS {
        sqlx::query("INSERT INTO stock (sku, available) VALUES (?, ?)")
            .bind(sku)
            .bind(available)
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// The order service: the order row and its event commit together.
pub async fn place_order(
    pool: &SqlitePool,
    outbox: &SqliteOutbox,
    n: i64,
) -> Result<Uuid, Box<dyn std::error::Error + Send + Sync>> {
    let (sku, _) = PRODUCTS[n as usize % PRODUCTS.len()];
    let qty = 1 + n % 3;
    let customer = format!("customer-{}", n % 37);
    let mut tx = pool.begin().await?;
    let id: i64 =
        sqlx::query_scalar("INSERT INTO orders (customer, sku, qty) VALUES (?, ?, ?) RETURNING id")
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

/// Applies `OrderCreated` for `consumer` once: inbox row and effect in one transaction.
pub async fn consume(
    pool: &SqlitePool,
    inbox: &SqliteInbox,
    consumer: &str,
    event_id: Uuid,
    body: &serde_json::Value,
) -> Result<Seen, Box<dyn std::error::Error + Send + Sync>> {
    let mut tx = pool.begin().await?;
    let seen = inbox.record(&mut tx, consumer, event_id).await?;
    if seen == Seen::New {
        apply(&mut tx, consumer, body).await?;
        sqlx::query("INSERT INTO applied_log (consumer, event_id) VALUES (?, ?)")
            .bind(consumer)
            .bind(event_id.to_string())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(seen)
}

async fn apply(
    tx: &mut SqliteConnection,
    consumer: &str,
    body: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    let order_id = body["order_id"].as_i64().unwrap_or_default();
    match consumer {
        "inventory" => {
            sqlx::query(
                "UPDATE stock SET available = available - ?2, reserved = reserved + ?2
                 WHERE sku = ?1",
            )
            .bind(body["sku"].as_str().unwrap_or_default())
            .bind(body["qty"].as_i64().unwrap_or_default())
            .execute(&mut *tx)
            .await?;
        }
        _ => {
            sqlx::query("INSERT INTO notifications (order_id, message) VALUES (?, ?)")
                .bind(order_id)
                .bind(format!(
                    "Thanks {}, your order #{order_id} is confirmed",
                    body["customer"].as_str().unwrap_or("customer")
                ))
                .execute(&mut *tx)
                .await?;
        }
    }
    Ok(())
}
