//! The relay: its builder, and `run`, which wires the stages together (the source, polling or
//! CDC; dispatch; completion) beside the lease task and the background upkeep.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{
    admin::Admin,
    complete::Completer,
    config::{OnDead, RelayConfig},
    error::Error,
    health::Health,
    lease::{self, LeaseSettings, Leases},
    maintenance,
    publisher::Publisher,
    source::poll::Poll,
    store::Store,
    telemetry::Metrics,
    wire::fanout::Downcasts,
    wire::outgoing::Outgoing,
};

/// A configured relay, ready to [`run`](Relay::run).
pub struct Relay {
    shared: Arc<Shared>,
}

/// What the relay loop and its batch tasks share.
struct Shared {
    store: Arc<dyn Store>,
    /// Operator actions: the periodic purge uses them.
    admin: Option<Admin>,
    /// What the relay publishes through: the broker's publisher, wrapped by
    /// [`crate::wire::outgoing::Outgoing`] when the config fans out or changes the envelope.
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
    relay_id: String,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    leases: Arc<Leases>,
    /// The CDC source's statements and replication stream (`mode = "cdc"`).
    #[cfg(feature = "postgres")]
    cdc: Option<Arc<dyn crate::source::cdc::CdcDb>>,
}

/// What a relay is made of, as [`crate::builder::RelayBuilder::build`] opened it.
pub(crate) struct Parts {
    pub store: Arc<dyn Store>,
    pub admin: Option<Admin>,
    pub publisher: Arc<dyn Publisher>,
    pub config: RelayConfig,
    #[cfg(feature = "postgres")]
    pub cdc: Option<Arc<dyn crate::source::cdc::CdcDb>>,
    pub downcasts: Downcasts,
}

/// A relay running in the background.
pub struct RelayHandle {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

impl RelayHandle {
    /// Asks the relay to stop (finish in-flight batches, release leases) and waits for it.
    pub async fn shutdown(self) -> Result<(), Error> {
        self.shutdown.cancel();
        self.task.await.expect("relay task panicked")
    }

    /// Stops the relay abruptly, as a crash would: nothing is finished or released.
    pub fn abort(self) {
        self.task.abort();
    }

    /// Whether the relay has stopped: by itself only on a panic or on an error it cannot go
    /// on from (a CDC slot that belongs to another database); [`RelayHandle::shutdown`] then
    /// returns the error.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Relay {
    /// The relay [`crate::builder::RelayBuilder::build`] opened: every part known at once.
    pub(crate) fn assemble(parts: Parts) -> Self {
        let Parts {
            store,
            admin,
            publisher,
            config,
            #[cfg(feature = "postgres")]
            cdc,
            downcasts,
        } = parts;
        let relay_id = config.relay_id.clone().unwrap_or_else(default_relay_id);
        let health = Arc::new(Health::new(config.stall_timeout));
        let metrics = Arc::new(Metrics::new());
        Self {
            shared: Arc::new(Shared {
                store,
                admin,
                publisher: Outgoing::wrap(publisher, &config, downcasts, metrics.clone()),
                config,
                relay_id,
                metrics,
                health,
                leases: Arc::new(Leases::default()),
                #[cfg(feature = "postgres")]
                cdc,
            }),
        }
    }

    /// This relay's id in the lease table.
    pub fn relay_id(&self) -> &str {
        &self.shared.relay_id
    }

    /// The relay's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// The relay's readiness markers.
    pub fn health(&self) -> Arc<Health> {
        self.shared.health.clone()
    }

    /// Runs in a background task until [`RelayHandle::shutdown`].
    pub fn spawn(self) -> RelayHandle {
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move { self.run(token).await });
        RelayHandle { shutdown, task }
    }

    /// Runs until `shutdown` is cancelled, then finishes the batches in flight, releases its
    /// leases and returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let this = self.shared;
        let cdc = this.config.mode == crate::config::Mode::Cdc;
        #[cfg(feature = "postgres")]
        if cdc && this.cdc.is_none() {
            return Err(Error::Config(
                "mode = \"cdc\" needs a PostgreSQL relay and its database URL \
                 (RelayBuilder::replication_url)"
                    .into(),
            ));
        }
        let background = CancellationToken::new();
        let _stop_background = background.clone().drop_guard();
        tracing::info!(relay_id = %this.relay_id, publisher = this.publisher.name(),
            partitions = this.store.partitions(), "relay starting");
        let lease_task = tokio::spawn(lease::run(
            this.store.clone(),
            this.leases.clone(),
            LeaseSettings {
                relay_id: this.relay_id.clone(),
                hostname: hostname(),
                ttl: this.config.lease_ttl,
                heartbeat: this.config.heartbeat_interval,
                exclusive: cdc,
                answer_within: this.answer_within(),
            },
            this.metrics.clone(),
            this.health.clone(),
            background.clone(),
        ));
        let wake = Arc::new(tokio::sync::Notify::new());
        // The relay's background tasks: none outlives `run` (see the end).
        let mut upkeep = tokio::task::JoinSet::new();
        if !cdc {
            if let Some(listener) = this.store.notifications(wake.clone(), background.clone()) {
                upkeep.spawn(listener);
            }
        }
        upkeep.spawn(maintenance::sample_stats(
            this.store.clone(),
            this.metrics.clone(),
            this.health.clone(),
            this.config.stats_interval,
            this.answer_within(),
            background.clone(),
        ));
        if let Some(admin) = this.admin.clone() {
            upkeep.spawn(maintenance::maintain_periodically(
                admin,
                this.config.purge_retention,
                this.config.purge_interval,
                this.metrics.clone(),
                background.clone(),
            ));
        }
        let completer = Arc::new(Completer {
            store: this.store.clone(),
            relay_id: this.relay_id.clone(),
            metrics: this.metrics.clone(),
            health: this.health.clone(),
            leases: this.leases.clone(),
            retry: this.config.retry.clone(),
            park: this.config.on_dead == OnDead::Park,
            answer_within: this.answer_within(),
        });
        let result = if cdc {
            this.stream(completer, &shutdown).await
        } else {
            let poll = Arc::new(Poll {
                store: this.store.clone(),
                publisher: this.publisher.clone(),
                config: this.config.clone(),
                relay_id: this.relay_id.clone(),
                metrics: this.metrics.clone(),
                health: this.health.clone(),
                leases: this.leases.clone(),
                completer,
                max_payload: this.max_payload_bytes(),
            });
            poll.run(&wake, &shutdown).await
        };
        // Stop the lease task and wait for it: a heartbeat in progress could otherwise acquire
        // partitions (freed by relays shutting down alongside) after the release below.
        background.cancel();
        let _ = lease_task.await;
        // Background tasks stop at their next wait; one in the middle of a long purge gets a
        // few seconds to finish its statement, then is aborted (each purge batch commits on its
        // own; a partition drop in progress rolls back).
        let finished = async { while upkeep.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(5), finished)
            .await
            .is_err()
        {
            upkeep.shutdown().await;
        }
        let leases = this.leases.take_all();
        if let Err(error) = this.store.release(&this.relay_id, &leases).await {
            tracing::warn!(%error, "could not release leases; they expire by themselves");
        }
        let _ = this.store.deregister(&this.relay_id).await;
        this.metrics.partitions_owned.set(0);
        tracing::info!(relay_id = %this.relay_id, "relay stopped");
        result
    }
}

impl Shared {
    /// How long the relay waits for the database to answer one statement: the server's
    /// `statement_timeout` and 5 s more. Past it, a connection that hangs without an error
    /// (a network black hole) counts as a failed statement, so that the loop goes on.
    fn answer_within(&self) -> Duration {
        self.config.statement_timeout + Duration::from_secs(5)
    }

    /// Largest payload published: the configured limit, never above the broker's.
    fn max_payload_bytes(&self) -> usize {
        self.config
            .max_payload_bytes
            .unwrap_or(usize::MAX)
            .min(self.publisher.max_payload_bytes())
    }

    /// Runs the CDC source (`mode = "cdc"`) until `shutdown`.
    #[cfg(feature = "postgres")]
    async fn stream(
        &self,
        completer: Arc<Completer>,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let context = crate::source::cdc::context::Context {
            completer,
            db: self.cdc.clone().expect("checked"),
            tables: self.config.tables(),
            store: self.store.clone(),
            publisher: self.publisher.clone(),
            config: self.config.clone(),
            leases: self.leases.clone(),
            metrics: self.metrics.clone(),
            health: self.health.clone(),
            relay_id: self.relay_id.clone(),
            max_payload: self.max_payload_bytes(),
            unconfirmed: Default::default(),
        };
        crate::source::cdc::run(context, shutdown.clone()).await
    }

    /// Without the `postgres` feature there is no CDC source (the configuration refuses
    /// `mode = "cdc"` first).
    #[cfg(not(feature = "postgres"))]
    async fn stream(
        &self,
        completer: Arc<Completer>,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let _ = (completer, shutdown);
        Err(Error::Config(
            "mode = \"cdc\" needs the `postgres` feature of outbox-relayer".into(),
        ))
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

fn default_relay_id() -> String {
    format!(
        "{}-{}-{:04x}",
        hostname(),
        std::process::id(),
        rand::random::<u16>()
    )
}
