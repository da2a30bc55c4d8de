//! Quickstart: save an order and its `OrderPlaced` event in one transaction.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p outbox-quickstart
//! outbox relay --database-url $DATABASE_URL --broker-url nats://127.0.0.1:4222
//! ```

use outbox::{
    postgres::{MigrateOptions, PgOutbox},
    DomainEvent, Outbox,
};

/// The event: its Rust type names its aggregate type and event type once, for every writer.
#[derive(serde::Serialize)]
struct OrderPlaced {
    order_id: i64,
    customer: String,
    total: String,
}

impl DomainEvent for OrderPlaced {
    const AGGREGATE_TYPE: &'static str = "order";
    const EVENT_TYPE: &'static str = "OrderPlaced";
}

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
    let placed = OrderPlaced {
        order_id,
        customer: "ada".into(),
        total: "19.90".into(),
    };
    let event_id = outbox.publish(&mut tx, order_id, &placed).await?;
    tx.commit().await?;

    println!("order {order_id} saved; event {event_id} is in the outbox, waiting for the relay");
    Ok(())
}
