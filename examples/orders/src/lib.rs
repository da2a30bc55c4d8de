//! The orders flow of the source documents, end to end: an order service creates orders and
//! writes `OrderCreated` in the same transaction; the relay publishes them; an inventory and a
//! notifications consumer apply each event once through the inbox. [`run`] plays it, kills the
//! relay midway, and counts.
//!
//! It runs on SQLite (a file of its own, the embedded default), PostgreSQL or MySQL/MariaDB,
//! through the relay's webhook publisher to the scenario's own consumers on loopback HTTP, or
//! (PostgreSQL) through NATS JetStream or RabbitMQ to `outbox-consumer`'s runners. `outbox demo`
//! is this scenario; the order saga is in [`fulfilment`].

#[cfg(feature = "brokers")]
mod brokers;
#[cfg(feature = "brokers")]
pub mod fulfilment;
pub mod shop;
mod summary;
mod transport;
#[cfg(feature = "webhook")]
mod webhooks;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use outbox::Tables;
use outbox_relayer::{retry::RetryPolicy, routing::RoutingConfig, RelayConfig};
use tokio_util::sync::CancellationToken;

use shop::{Storage, CONSUMERS};
pub use summary::{Deliveries, Summary};
use transport::Transport;

/// Boxed error for the example's plumbing.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What to run.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// `postgres://…`, `mysql://…` or `mariadb://…`: the run gets a schema or a database of its
    /// own there. `None`: SQLite, in a file of its own.
    pub database_url: Option<String>,
    /// `nats://…` or `amqp://…` (with a PostgreSQL database). `None`: webhooks.
    pub broker_url: Option<String>,
    /// Orders to place.
    pub orders: u32,
    /// Kill the relay abruptly when 40% of the orders were applied, and start another.
    pub crash: bool,
    /// Webhooks: lose the acknowledgement of every Nth delivery (0: never), so the relay
    /// delivers it again and the inbox discards it.
    pub drop_ack_every: u64,
    /// Keep the run's schema, database or file instead of removing it.
    pub keep: bool,
}

impl Scenario {
    /// `orders` orders on SQLite and webhooks, a crash, every 15th acknowledgement lost.
    pub fn new(orders: u32) -> Self {
        Self {
            database_url: None,
            broker_url: None,
            orders,
            crash: true,
            drop_ack_every: 15,
            keep: false,
        }
    }
}

/// What a run tells as it goes.
pub trait Observer: Sync {
    /// `applied` of `total` orders were applied by every consumer; the inbox discarded
    /// `duplicates` deliveries (webhooks; 0 otherwise).
    fn progress(&self, _applied: i64, _total: i64, _duplicates: u64) {}
    /// Something happened (where the run is, the crash).
    fn say(&self, line: &str) {
        println!("  {line}");
    }
}

/// Prints what happens, without progress.
pub struct Lines;

impl Observer for Lines {}

/// Runs the scenario and returns the counts. What the run created (schema, database or file,
/// stream or exchange) is removed at the end, unless `keep`.
pub async fn run(s: &Scenario, observer: &dyn Observer) -> Result<Summary, BoxError> {
    Transport::check(s)?;
    let storage = Arc::new(Storage::open(s.database_url.as_deref()).await?);
    let result = play(s, &storage, observer).await;
    if s.keep {
        observer.say(&format!("kept: {}", storage.describe()));
    } else {
        storage.remove().await;
    }
    result
}

async fn play(
    s: &Scenario,
    storage: &Arc<Storage>,
    observer: &dyn Observer,
) -> Result<Summary, BoxError> {
    let stop = CancellationToken::new();
    let transport = Transport::start(s, storage, stop.clone()).await?;
    observer.say(&format!(
        "storage: {}, transport: {}",
        storage.describe(),
        transport.describe()
    ));
    let config = relay_config(storage.tables());
    let start_relay = |id: &str| {
        let config = RelayConfig {
            relay_id: Some(id.to_owned()),
            ..config.clone()
        };
        let transport = &transport;
        async move {
            let publisher = transport.publisher().await?;
            Ok::<_, BoxError>(storage.relay(publisher, config).await?.spawn())
        }
    };

    let started = Instant::now();
    let mut relay = Some(start_relay("relay-1").await?);
    let total = i64::from(s.orders);
    let mut writer = Some({
        let storage = storage.clone();
        tokio::spawn(async move {
            for n in 0..total {
                storage.place_order(n).await?;
                // Customers arrive over a while, so that the crash lands mid-flow.
                if n % 10 == 9 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Ok::<(), BoxError>(())
        })
    });
    let consumers = CONSUMERS.len() as i64;
    let mut crashed = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let applied = summary::applied_pairs(storage).await?;
        observer.progress(applied / consumers, total, transport.duplicates());
        if s.crash && !crashed && applied >= total * consumers * 2 / 5 {
            relay.take().expect("running").abort();
            crashed = true;
            observer.say(&format!(
                "relay-1 killed abruptly (as kill -9) after {} of {total} orders were applied; \
                 relay-2 takes over when its lease expires",
                applied / consumers
            ));
            relay = Some(start_relay("relay-2").await?);
        }
        if writer.as_ref().is_some_and(|w| w.is_finished()) {
            writer.take().expect("finished").await??;
        }
        if applied >= total * consumers && writer.is_none() {
            break;
        }
        if Instant::now() > deadline {
            observer.say("timed out waiting for the consumers");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(writer) = writer {
        writer.abort();
    }
    // The consumers have applied every event, but the relay marks an event published only once
    // acknowledged, in batches, and retries a delivery whose acknowledgement was lost after a
    // backoff: wait for its marks, then stop it, so that nothing changes while counting.
    if !summary::all_marked(storage, Duration::from_secs(30)).await? {
        observer.say("timed out waiting for the relay to mark every event published");
    }
    if let Some(relay) = relay {
        relay.shutdown().await?;
    }
    stop.cancel();
    let deliveries = transport.finish().await;
    Ok(Summary::collect(storage, total, crashed, started.elapsed(), deliveries).await?)
}

/// The relay settings of the example runs: short leases so that a killed relay is replaced
/// quickly, and subjects or routing keys under the run's schema.
pub(crate) fn relay_config(tables: &Tables) -> RelayConfig {
    RelayConfig {
        schema: tables.schema().as_str().to_owned(),
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        poll_interval: Duration::from_millis(100),
        stats_interval: Duration::from_millis(500),
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
