//! Quickstart: save an order and its `OrderPlaced` event in one transaction.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p outbox-quickstart
//! outbox relay --database-url $DATABASE_URL --broker-url nats://127.0.0.1:4222
//! ```

use outbox::{
    postgres::{MigrateOptions, PgOutbox},
    Event,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let outbox = PgOutbox::default();
    outbox.migrate(&pool, MigrateOptions::default()).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS quickstart_orders (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             customer text NOT NULL,
             total numeric NOT NULL)",
    )
    .execute(&pool)
    .await?;

    // The business change and the event commit together, or not at all.
    let mut tx = pool.begin().await?;
    let order_id: i64 = sqlx::query_scalar(
        "INSERT INTO quickstart_orders (customer, total) VALUES ($1, $2::numeric) RETURNING id",
    )
    .bind("ada")
    .bind("19.90")
    .fetch_one(&mut *tx)
    .await?;
    let event = Event::new("order", order_id.to_string(), "OrderPlaced")
        .json(&serde_json::json!({ "order_id": order_id, "customer": "ada", "total": "19.90" }))?
        .aggregate_version(1);
    let event_id = outbox.enqueue(&mut tx, &event).await?;
    tx.commit().await?;

    println!("order {order_id} saved; event {event_id} is in the outbox, waiting for the relay");
    Ok(())
}
