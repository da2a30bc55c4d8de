//! The README's Rust examples, compiled: each line of each `rust` block of README.md appears,
//! in order, in the code below (which only adds the function around its statements), so the
//! README cannot show code that does not build.

#![allow(dead_code)]

#[rustfmt::skip]
mod readme {
    use outbox::{postgres::PgOutbox, DomainEvent, Outbox};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct OrderPlaced { order_id: i64, sku: String, qty: i64 }

    impl DomainEvent for OrderPlaced {                   // shared by writers and consumers
        const AGGREGATE_TYPE: &'static str = "order";    // with the id: the ordering key
        const EVENT_TYPE: &'static str = "OrderPlaced";
        // const SCHEMA_VERSION: i32 = 1;                // the default; consumers upcast older ones
    }

    async fn write(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
        let outbox = PgOutbox::default();                     // schema `outbox`, table `events`
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO orders (id, sku, qty) VALUES ($1, $2, $3)")
            .bind(42_i64).bind("apple").bind(2_i64).execute(&mut *tx).await?;
        let placed = OrderPlaced { order_id: 42, sku: "apple".into(), qty: 2 };
        let event_id = outbox.publish(&mut tx, 42, &placed).await?; // in your transaction; never commits
        tx.commit().await?;                                   // the event exists only if this commits
        let _ = event_id;
        Ok(())
    }

    use std::sync::Arc;
    use outbox_consumer::{nats::{NatsConsumer, NatsSource}, ConsumerConfig, Envelope, Handle,
                          HandlerError, Handlers, Processor};
    use sqlx::PgConnection;

    struct Inventory;

    impl Handle<OrderPlaced> for Inventory {
        async fn handle(&self, tx: &mut PgConnection, order: OrderPlaced, _: &Envelope)
            -> Result<(), HandlerError> {          // runs in the transaction that records the inbox row
            sqlx::query("UPDATE stock SET reserved = reserved + $1 WHERE sku = $2")
                .bind(order.qty).bind(&order.sku).execute(tx).await?;
            Ok(())
        }
    }

    async fn consume(
        pool: sqlx::PgPool,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let handlers = Handlers::new().on::<OrderPlaced>(Inventory);     // older versions: .upcast::<OrderPlaced>(..)
        let processor = Processor::new(pool, &outbox::Tables::default(), "inventory", Arc::new(handlers));
        let source = NatsSource::new("nats://127.0.0.1:4222", "OUTBOX");
        NatsConsumer::connect(source, ConsumerConfig::new("inventory"), processor).await?
            .run(shutdown).await?;                                         // until the CancellationToken fires
        Ok(())
    }
}

/// The `rust` blocks of `markdown`, as lists of trimmed lines without the empty ones.
fn rust_blocks(markdown: &str) -> Vec<Vec<&str>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```rust") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.push(current.take().expect("in a block")),
            (Some(block), code) if !code.trim().is_empty() => block.push(code.trim()),
            _ => {}
        }
    }
    blocks
}

#[test]
fn every_rust_block_of_the_readme_is_compiled_here() {
    let readme = include_str!("../../../README.md");
    let this: Vec<&str> = include_str!("readme.rs").lines().map(str::trim).collect();
    let blocks = rust_blocks(readme);
    assert_eq!(
        blocks.len(),
        2,
        "the README's Rust blocks: add new ones here"
    );
    let mut at = 0;
    for block in blocks {
        for line in block {
            let found = this[at..].iter().position(|l| *l == line);
            let Some(offset) = found else {
                panic!("README line not compiled here (or out of order): {line}");
            };
            at += offset + 1;
        }
    }
}
