//! An order service with the relay inside: `POST /orders` saves the order and its
//! `OrderPlaced` event in one PostgreSQL transaction, and the relay, running in the same
//! process, publishes the event to the broker. No second process to deploy; several replicas
//! of the service share the outbox's partitions between their relays.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test BROKER_URL=nats://127.0.0.1:4222 \
//!     cargo run -p outbox-example-service
//! curl -s -XPOST localhost:3000/orders -H 'content-type: application/json' \
//!     -d '{"customer": "ada", "sku": "apple", "qty": 2}'
//! ```
//!
//! On shutdown (SIGTERM, Ctrl-C) the service stops taking requests and lets those under way
//! finish, then stops the relay, which finishes the publishes in flight, records them and
//! releases its partitions; events still pending are published by the next relay that runs.

pub mod orders;

use outbox::Outbox;
use std::{future::Future, net::SocketAddr, time::Duration};

use outbox::postgres::{MigrateOptions, PgOutbox};
use outbox_relayer::{publishers::BrokerSettings, Relay, RelayConfig};
use sqlx::postgres::PgPoolOptions;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;

/// Boxed error for the service's start and stop.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the service runs on.
#[derive(Clone, Debug)]
pub struct Config {
    /// The PostgreSQL database of the orders and the outbox.
    pub database_url: String,
    /// The broker the relay publishes to (`nats://…`).
    pub broker_url: String,
    /// Where the HTTP endpoints listen (`POST /orders`, and the relay's `/healthz`, `/readyz`,
    /// `/metrics`).
    pub listen: SocketAddr,
    /// The relay's settings; its `schema` and `table` are the outbox's, and the orders table
    /// lives in the same schema.
    pub relay: RelayConfig,
    /// The broker's settings (`[nats]`: stream name, …).
    pub brokers: BrokerSettings,
    /// On a stop, how long requests under way may take to finish; then their connections are
    /// closed (their transactions roll back) and the relay is stopped anyway.
    pub drain_timeout: Duration,
}

/// The running service.
pub struct Service {
    addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<Result<(), BoxError>>,
}

impl Service {
    /// Migrates the outbox, creates the orders table, connects the broker and starts both the
    /// HTTP server and the relay.
    pub async fn start(config: Config) -> Result<Self, BoxError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&config.database_url)
            .await?;
        let tables = config.relay.tables();
        PgOutbox::new(tables.clone())
            .migrate(&pool, MigrateOptions::default())
            .await?;
        let shop = orders::Shop::install(pool.clone(), &tables).await?;

        let publisher =
            outbox_relayer::publishers::connect(&config.broker_url, config.brokers).await?;
        let relay = Relay::builder(pool, publisher, config.relay)
            .build()
            .await?;
        let app = shop.router().merge(outbox_relayer::http::router(
            relay.metrics(),
            relay.health(),
        ));
        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;

        let stop = CancellationToken::new();
        let relay_stop = CancellationToken::new();
        let mut relay = tokio::spawn(relay.run(relay_stop.clone()));
        let http_stop = stop.clone();
        let drain_timeout = config.drain_timeout;
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app)
                .with_graceful_shutdown(http_stop.clone().cancelled_owned());
            // A client that never finishes its request must not hold the stop (and the relay's
            // leases) until the orchestrator kills the process.
            let http = async move {
                tokio::select! {
                    served = serve => served,
                    () = async {
                        http_stop.cancelled().await;
                        tokio::time::sleep(drain_timeout).await;
                    } => {
                        tracing::warn!(?drain_timeout, "requests still under way: closing them");
                        Ok(())
                    }
                }
            };
            tokio::select! {
                served = http => {
                    // Requests under way have finished: every event they wrote is committed.
                    // Now the relay finishes its in-flight publishes and releases its leases.
                    relay_stop.cancel();
                    let relayed = relay.await?;
                    served?;
                    relayed?;
                }
                relayed = &mut relay => {
                    // The relay stopped on its own: an error it cannot go on from.
                    relayed??;
                    return Err("the relay stopped".into());
                }
            }
            Ok(())
        });
        tracing::info!(%addr, "order service listening");
        Ok(Self { addr, stop, task })
    }

    /// Where the HTTP endpoints listen.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops gracefully (see the crate's documentation) and returns how the service ended.
    pub async fn stop(self) -> Result<(), BoxError> {
        self.stop.cancel();
        self.task.await?
    }

    /// Runs until `signal` (then stops gracefully) or until the service ends by itself on an
    /// error of the relay or the server, and returns how it ended.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<(), BoxError> {
        let Self { stop, mut task, .. } = self;
        tokio::select! {
            () = signal => {
                stop.cancel();
                task.await?
            }
            ended = &mut task => ended?,
        }
    }
}
