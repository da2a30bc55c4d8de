//! The orders flow of the source documents on PostgreSQL and a real broker: an order service
//! creates orders and writes `OrderCreated` in the same transaction; the relay publishes to
//! NATS JetStream or RabbitMQ; an inventory and a notifications consumer apply each event once
//! through the inbox. [`run`] plays it end to end, kills the relay midway, and counts.
//! `outbox demo --database-url … --broker-url …` runs it too.

mod brokers;
pub mod fulfilment;
pub mod shop;
mod summary;

use std::time::{Duration, Instant};

use outbox::{
    postgres::{MigrateOptions, PgOutbox},
    Tables,
};
use outbox_relay::{retry::RetryPolicy, routing::RoutingConfig, Relay, RelayConfig};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub use summary::Summary;

/// Boxed error for the example's plumbing.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What to run.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// PostgreSQL URL.
    pub database_url: String,
    /// `nats://…` or `amqp://…`.
    pub broker_url: String,
    /// Orders to place.
    pub orders: u32,
    /// Kill the relay abruptly when 40% of the orders were applied, and start another.
    pub crash: bool,
}

/// Runs the scenario in a schema, stream/exchange and consumer names of its own, removed at the
/// end, and returns the counts.
pub async fn run(s: &Scenario) -> Result<Summary, BoxError> {
    let pool = PgPool::connect(&s.database_url).await?;
    let schema = format!("orders_{:08x}", rand_u32());
    let tables = Tables::new(&schema, "events")?;
    let result = play(s, &pool, &tables).await;
    let _ = sqlx::raw_sql(&tables.render("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&pool)
        .await;
    result
}

async fn play(s: &Scenario, pool: &PgPool, tables: &Tables) -> Result<Summary, BoxError> {
    let outbox = PgOutbox::new(tables.clone());
    outbox
        .migrate(
            pool,
            MigrateOptions {
                partitions: Some(8),
                ..Default::default()
            },
        )
        .await?;
    shop::install(pool, tables).await?;
    let broker = brokers::Broker::set_up(&s.broker_url, tables, brokers::ORDER_CONSUMERS).await?;
    let stop = CancellationToken::new();
    let consumers = broker.start_consumers(pool, tables, stop.clone()).await?;

    let config = relay_config(tables);
    let start_relay = |id: &str| {
        let config = RelayConfig {
            relay_id: Some(id.to_owned()),
            ..config.clone()
        };
        let (pool, publisher) = (pool.clone(), broker.publisher());
        async move { Ok::<_, BoxError>(Relay::new(pool, publisher.await?, config).await?.spawn()) }
    };

    let started = Instant::now();
    let mut relay = Some(start_relay("orders-relay-1").await?);
    let total = i64::from(s.orders);
    let writer = {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        tokio::spawn(async move {
            for n in 0..total {
                shop::place_order(&pool, &outbox, n).await?;
            }
            Ok::<(), BoxError>(())
        })
    };
    let mut crashed = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let applied = summary::applied_pairs(pool, tables).await?;
        if s.crash && !crashed && applied >= total * 2 * 2 / 5 {
            relay.take().expect("running").abort();
            crashed = true;
            println!(
                "  relay killed abruptly (as kill -9) after {} of {total} orders were applied; \
                      another takes over when its lease expires",
                applied / 2
            );
            relay = Some(start_relay("orders-relay-2").await?);
        }
        if applied >= total * 2 && writer.is_finished() {
            break;
        }
        if Instant::now() > deadline {
            println!("  timed out waiting for the consumers");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    writer.await??;
    // The consumers have applied every event, but the relay marks an event published only once
    // acknowledged, in batches: wait for its marks, then stop it, so that nothing changes while
    // counting.
    if !summary::all_marked(pool, tables, Duration::from_secs(30)).await? {
        println!("  timed out waiting for the relay to mark every event published");
    }
    if let Some(relay) = relay {
        relay.shutdown().await?;
    }
    stop.cancel();
    for consumer in consumers {
        let _ = consumer.await;
    }
    let summary = Summary::collect(pool, tables, total, crashed, started.elapsed()).await?;
    broker.clean_up().await;
    Ok(summary)
}

/// The relay settings of the example runs: short leases so that a killed relay is replaced
/// quickly, and subjects or routing keys under the run's schema.
pub(crate) fn relay_config(tables: &Tables) -> RelayConfig {
    RelayConfig {
        schema: tables.schema().as_str().to_owned(),
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        poll_interval: Duration::from_millis(100),
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(50),
            max_transient_backoff: Duration::from_millis(500),
            ..Default::default()
        },
        routing: RoutingConfig {
            default: format!(
                "{}.{{aggregate_type}}.{{event_type}}",
                tables.schema().as_str()
            ),
            rules: vec![],
        },
        ..Default::default()
    }
}

fn rand_u32() -> u32 {
    rand::random()
}
