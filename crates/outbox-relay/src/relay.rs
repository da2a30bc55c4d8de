//! The relay loop: claim, dispatch, complete; with a pipeline of batches in flight over
//! disjoint partitions.

use std::{collections::HashSet, sync::Arc, time::Duration};

use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    config::{OnDead, RelayConfig},
    dispatcher::{self, Item, Outcome},
    fanout::Downcasts,
    http::Health,
    lease::{self, LeaseSettings, Leases},
    outgoing::Outgoing,
    retry::Backoff,
    store::{within, Claimed, ClaimedRow, Fence, PgStore, Store, Timeouts},
    telemetry::{DestinationLabel, FailureLabels, Metrics},
    Error, FailureClass, Publisher,
};

/// A configured relay, ready to [`run`](Relay::run).
pub struct Relay {
    shared: Arc<Shared>,
}

/// What the relay loop and its batch tasks share.
struct Shared {
    store: Arc<dyn Store>,
    /// Operator actions (PostgreSQL only): the periodic purge uses them.
    admin: Option<crate::admin::Admin>,
    /// What the relay publishes through: the broker's publisher, wrapped by
    /// [`crate::outgoing::Outgoing`] when the config fans out or changes the envelope.
    publisher: Arc<dyn Publisher>,
    /// The broker's publisher itself, to wrap again with [`Relay::with_downcasts`].
    broker: Arc<dyn Publisher>,
    config: RelayConfig,
    relay_id: String,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    leases: Arc<Leases>,
    /// The PostgreSQL pool (CDC mode needs it beside the store).
    pool: Option<PgPool>,
    /// Where the CDC source's replication connection goes (`mode = "cdc"`).
    replication: Option<crate::cdc::ReplicationTarget>,
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

    /// Whether the relay has stopped (it only stops by itself on a panic).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Relay {
    /// Validates the configuration and opens the PostgreSQL outbox (which must have been
    /// migrated). The relay opens its own connections, lazily, with `pool`'s connect options
    /// and size, adding `statement_timeout` and `lock_timeout` from the configuration; its
    /// lease statements have two connections of their own.
    pub async fn new(
        pool: PgPool,
        publisher: Arc<dyn Publisher>,
        config: RelayConfig,
    ) -> Result<Self, Error> {
        config.validate()?;
        let pool = Timeouts {
            statement: config.statement_timeout,
            lock: config.lock_timeout,
        }
        .apply(&pool);
        let admin = crate::admin::Admin::new(pool.clone(), &config.tables());
        let store = PgStore::open(pool.clone(), &config.tables()).await?;
        let mut relay = Self::with_store(Arc::new(store), publisher, config)?;
        let shared = Arc::get_mut(&mut relay.shared).expect("not shared yet");
        shared.admin = Some(admin);
        shared.pool = Some(pool);
        Ok(relay)
    }

    /// The same relay, with the database URL its CDC source (`mode = "cdc"`) opens its
    /// replication connection to: the URL the pool was opened with (the pool cannot give the
    /// password back). Needs the REPLICATION attribute for the user.
    pub fn with_replication_url(mut self, database_url: &str) -> Result<Self, Error> {
        let target = crate::cdc::ReplicationTarget::from_url(database_url)?;
        Arc::get_mut(&mut self.shared)
            .expect("not running yet")
            .replication = Some(target);
        Ok(self)
    }

    /// Opens the SQLite outbox (migrated with `outbox::sqlite::SqliteOutbox::migrate`). One
    /// relay publishes at a time; another on the same file waits as a standby.
    pub async fn sqlite(
        pool: sqlx::SqlitePool,
        publisher: Arc<dyn Publisher>,
        config: RelayConfig,
    ) -> Result<Self, Error> {
        config.validate()?;
        if config.purge_retention.is_some() {
            return Err(Error::Config(
                "purge_retention: the relay's purge runs on PostgreSQL only; unset it for SQLite"
                    .into(),
            ));
        }
        let store = crate::store::SqliteStore::open(pool, &config.tables()).await?;
        Self::with_store(Arc::new(store), publisher, config)
    }

    /// A relay over any [`Store`].
    pub fn with_store(
        store: Arc<dyn Store>,
        publisher: Arc<dyn Publisher>,
        config: RelayConfig,
    ) -> Result<Self, Error> {
        config.validate()?;
        let relay_id = config.relay_id.clone().unwrap_or_else(default_relay_id);
        let health = Arc::new(Health::new(config.stall_timeout));
        Ok(Self {
            shared: Arc::new(Shared {
                store,
                admin: None,
                publisher: Outgoing::wrap(publisher.clone(), &config, Downcasts::new()),
                broker: publisher,
                config,
                relay_id,
                metrics: Arc::new(Metrics::new()),
                health,
                leases: Arc::new(Leases::default()),
                pool: None,
                replication: None,
            }),
        })
    }

    /// The same relay, making fan-out copies with these Rust downcasts where they apply
    /// (instead of the copies' `keep_fields` / `drop_fields`). See [`crate::fanout`].
    pub fn with_downcasts(mut self, downcasts: Downcasts) -> Self {
        let shared = Arc::get_mut(&mut self.shared).expect("not running yet");
        shared.publisher = Outgoing::wrap(shared.broker.clone(), &shared.config, downcasts);
        self
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
        if cdc && (this.pool.is_none() || this.replication.is_none()) {
            return Err(Error::Config(
                "mode = \"cdc\" needs a PostgreSQL relay (Relay::new) and its database URL \
                 (Relay::with_replication_url)"
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
        upkeep.spawn(sample_stats(
            this.store.clone(),
            this.metrics.clone(),
            this.health.clone(),
            this.config.stats_interval,
            this.answer_within(),
            background.clone(),
        ));
        if let Some(admin) = this.admin.clone() {
            upkeep.spawn(maintain_periodically(
                admin,
                this.config.purge_retention,
                this.config.purge_interval,
                this.metrics.clone(),
                background.clone(),
            ));
        }
        let result = if cdc {
            let context = crate::cdc::source::Context {
                pool: this.pool.clone().expect("checked"),
                tables: this.config.tables(),
                store: this.store.clone(),
                publisher: this.publisher.clone(),
                config: this.config.clone(),
                leases: this.leases.clone(),
                metrics: this.metrics.clone(),
                health: this.health.clone(),
                relay_id: this.relay_id.clone(),
                target: this.replication.clone().expect("checked"),
                max_payload: this.max_payload_bytes(),
            };
            crate::cdc::run(context, shutdown.clone()).await
        } else {
            this.main_loop(&wake, &shutdown).await
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

    async fn main_loop(
        self: &Arc<Self>,
        wake: &tokio::sync::Notify,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let max_payload = self.max_payload_bytes();
        // A JoinSet aborts its tasks when dropped: an aborted relay leaves nothing running.
        let mut inflight = tokio::task::JoinSet::new();
        let mut busy: HashSet<i32> = HashSet::new();
        let mut batch_size = self.config.min_batch_size;
        let mut rotation = 0usize;
        // Per-partition scan floors (see `sql/claim.sql`), cleared every `rescan_interval`.
        let mut floors: std::collections::HashMap<i32, i64> = std::collections::HashMap::new();
        let mut full_scan_at = Instant::now();
        let mut more = true;
        let mut paused_until = Instant::now();
        let mut circuit = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        let mut db_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        // Bytes of claimed rows in the batches in flight, against `max_inflight_bytes`.
        let budget = i64::try_from(self.config.max_inflight_bytes).unwrap_or(i64::MAX);
        let mut inflight_bytes: i64 = 0;
        loop {
            self.health.loop_turned();
            let releasable = self.leases.take_releasable(&busy);
            if !releasable.is_empty() {
                tracing::info!(partitions = ?releasable.iter().map(|f| f.0).collect::<Vec<_>>(),
                    "releasing partitions for rebalancing");
                let released = within(
                    self.answer_within(),
                    self.store.release(&self.relay_id, &releasable),
                );
                if let Err(error) = released.await {
                    tracing::warn!(%error, "release failed; the leases will expire instead");
                }
            }
            let stopping = shutdown.is_cancelled();
            if stopping && inflight.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if !stopping
                && more
                && now >= paused_until
                && inflight.len() < self.config.max_inflight_batches
                && inflight_bytes < budget
            {
                let mut free: Vec<Fence> = self
                    .leases
                    .usable()
                    .into_iter()
                    .filter(|(p, _)| !busy.contains(p))
                    .collect();
                if free.is_empty() {
                    if busy.is_empty() {
                        // No partition to claim from: not waiting for a claim.
                        self.health.claim_done();
                    }
                    more = false;
                    continue;
                }
                rotation = rotation.wrapping_add(1);
                let shift = rotation % free.len();
                free.rotate_left(shift);
                if full_scan_at.elapsed() >= self.config.rescan_interval {
                    floors.clear();
                    full_scan_at = Instant::now();
                }
                let partitions: Vec<(i32, i64)> = free
                    .iter()
                    .map(|f| (f.0, floors.get(&f.0).copied().unwrap_or(0)))
                    .collect();
                self.health.claim_started();
                let claimed = within(
                    self.answer_within(),
                    self.store.claim(
                        &partitions,
                        batch_size,
                        max_payload,
                        budget - inflight_bytes,
                    ),
                )
                .await;
                match claimed {
                    Ok(Claimed { rows, cut }) => {
                        db_backoff.reset();
                        self.health.database_ok();
                        self.health.claim_done();
                        // Cut by the byte budget: more is waiting, whatever the row count.
                        let full = rows.len() as i64 >= batch_size || cut;
                        if !cut {
                            batch_size = adapt(batch_size, rows.len(), &self.config);
                        }
                        more = full;
                        if !full {
                            // Keeping up: the next claim scans from the start, so a row that
                            // committed after later ones is found at once. Floors only pay
                            // while a backlog keeps claims full.
                            floors.clear();
                        }
                        if rows.is_empty() {
                            continue;
                        }
                        self.health.saw_work();
                        self.metrics.batch_size.observe(rows.len() as f64);
                        // The new floor of each partition read: the lowest id found pending there.
                        let mut lowest: std::collections::HashMap<i32, i64> =
                            std::collections::HashMap::new();
                        for row in &rows {
                            let id = lowest.entry(row.partition).or_insert(row.id);
                            *id = (*id).min(row.id);
                        }
                        if full {
                            floors.extend(lowest);
                        }
                        let taken: HashSet<i32> = rows.iter().map(|r| r.partition).collect();
                        busy.extend(&taken);
                        let fences: Vec<Fence> = free
                            .into_iter()
                            .filter(|(p, _)| taken.contains(p))
                            .collect();
                        let bytes: i64 = rows.iter().map(|r| r.row_bytes.max(0)).sum();
                        inflight_bytes += bytes;
                        self.metrics.inflight_bytes.set(inflight_bytes);
                        inflight.spawn(self.clone().process(rows, fences, bytes));
                    }
                    Err(error) => {
                        self.metrics.database_errors.inc();
                        let delay = db_backoff.next();
                        tracing::warn!(%error, ?delay, "claim failed; retrying");
                        paused_until = Instant::now() + delay;
                    }
                }
                continue;
            }
            // Here either there is nothing to claim (wait for a wake-up or the poll), or the
            // publisher is paused (wait out the pause), or every batch slot is taken: then only
            // a finished batch frees one, and the timer is a mere fallback. (It was the pause,
            // zero, which made the loop spin while the batches published; the simulation
            // found it.)
            let pause = paused_until.saturating_duration_since(now);
            let full =
                inflight.len() >= self.config.max_inflight_batches || inflight_bytes >= budget;
            let idle = if more && !full {
                pause
            } else {
                self.config.poll_interval
            };
            tokio::select! {
                biased;
                Some(done) = inflight.join_next(), if !inflight.is_empty() => {
                    let done: BatchDone = done.expect("batch task panicked");
                    for p in &done.partitions {
                        busy.remove(p);
                    }
                    inflight_bytes -= done.bytes;
                    self.metrics.inflight_bytes.set(inflight_bytes);
                    more = true;
                    if done.published > 0 || done.dead > 0 {
                        self.health.progressed();
                    }
                    if done.transient > 0 && done.published == 0 {
                        let delay = circuit.next();
                        tracing::warn!(?delay, "broker failing; pausing the publisher");
                        paused_until = Instant::now() + delay;
                    } else if done.published > 0 {
                        circuit.reset();
                    }
                }
                () = wake.notified(), if !stopping => more = true,
                () = self.leases.changed(), if !stopping => more = true,
                () = tokio::time::sleep(idle), if !stopping => more = true,
                () = shutdown.cancelled(), if !stopping => {
                    tracing::info!(inflight = inflight.len(), "shutting down: finishing batches in flight");
                }
            }
        }
    }

    /// Publishes one claimed batch (of `bytes` in memory) and records the outcomes.
    async fn process(
        self: Arc<Self>,
        rows: Vec<ClaimedRow>,
        fences: Vec<Fence>,
        bytes: i64,
    ) -> BatchDone {
        let partitions: Vec<i32> = fences.iter().map(|f| f.0).collect();
        let epoch_of = |p: i32| fences.iter().find(|f| f.0 == p).map_or(-1, |f| f.1);
        let max_payload = self.max_payload_bytes();
        let items: Vec<Item> = rows
            .into_iter()
            .map(|row| {
                let message = row.decode_guarded(&self.config.routing, max_payload);
                let destination = message.as_ref().map_or_else(
                    |_| "(undecodable)".to_owned(),
                    |m| m.destination.clone(),
                );
                Item {
                    id: row.id,
                    partition: row.partition,
                    epoch: epoch_of(row.partition),
                    attempts: row.attempts,
                    permanent_failures: row.permanent_failures,
                    key: (row.aggregate_type, row.aggregate_id),
                    destination,
                    message: message.map_err(|e| {
                        tracing::warn!(event_id = %row.event_id, error = %e, "malformed outbox row");
                        e
                    }),
                }
            })
            .collect();
        let results = dispatcher::dispatch(
            items,
            self.publisher.clone(),
            self.leases.clone(),
            self.config.lane_concurrency,
            self.config.publish_timeout,
        )
        .await;
        let mut done = BatchDone {
            partitions,
            bytes,
            ..Default::default()
        };
        let mut published = Vec::new();
        let mut failures = Vec::new();
        // Counted per destination for the whole batch, then added to the metrics once each.
        let mut published_by_destination: std::collections::HashMap<&str, u64> =
            std::collections::HashMap::new();
        let now = (Instant::now(), chrono::Utc::now());
        let policy = &self.config.retry;
        for (item, outcome) in &results {
            match outcome {
                Outcome::Published(at) => {
                    published.push(item.id);
                    if let Ok(m) = &item.message {
                        // The ack's wall-clock time, from one clock reading per batch.
                        let acked = now.1
                            - chrono::Duration::from_std(now.0.saturating_duration_since(*at))
                                .unwrap_or_default();
                        let latency = acked - m.occurred_at;
                        self.metrics
                            .latency
                            .observe(latency.num_microseconds().unwrap_or(0).max(0) as f64 / 1e6);
                    }
                    *published_by_destination
                        .entry(item.destination.as_str())
                        .or_insert(0) += 1;
                }
                Outcome::Failed(error) => {
                    let attempts = item.attempts + 1;
                    let failure =
                        policy.failure(item.id, item.attempts, item.permanent_failures, error);
                    let dead = failure.dead;
                    let class = match error.class {
                        FailureClass::Transient => {
                            done.transient += 1;
                            "transient"
                        }
                        FailureClass::Permanent => "permanent",
                    };
                    let label = self.metrics.destination_label(&item.destination);
                    self.metrics
                        .failed
                        .get_or_create(&FailureLabels {
                            destination: label.clone(),
                            class: class.into(),
                        })
                        .inc();
                    if dead {
                        done.dead += 1;
                        self.metrics
                            .dead_lettered
                            .get_or_create(&DestinationLabel { destination: label })
                            .inc();
                        tracing::error!(id = item.id, aggregate_type = %item.key.0,
                            aggregate_id = %item.key.1, attempts, %error, "event dead-lettered");
                    } else {
                        tracing::debug!(id = item.id, attempts, %error, "publish failed; will retry");
                    }
                    failures.push(failure);
                }
                Outcome::Skipped => {}
            }
        }
        for (destination, n) in published_by_destination {
            self.metrics
                .published
                .get_or_create(&DestinationLabel {
                    destination: self.metrics.destination_label(destination),
                })
                .inc_by(n);
        }
        done.published = published.len();
        let park = self.config.on_dead == OnDead::Park;
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        // Record the outcomes; retry while the leases last. If they lapse, the successor
        // publishes the unmarked events again (duplicates, never losses).
        loop {
            let marked = async {
                let mut n = 0;
                if !published.is_empty() {
                    n += within(
                        self.answer_within(),
                        self.store
                            .mark_published(&self.relay_id, &fences, &published),
                    )
                    .await?;
                }
                if !failures.is_empty() {
                    n += within(
                        self.answer_within(),
                        self.store
                            .mark_failed(&self.relay_id, &fences, &failures, park),
                    )
                    .await?;
                }
                Ok::<i64, sqlx::Error>(n)
            }
            .await;
            match marked {
                Ok(n) => {
                    self.health.database_ok();
                    let expected = (published.len() + failures.len()) as i64;
                    if n < expected {
                        self.metrics.fenced_out.inc_by((expected - n) as u64);
                        tracing::warn!(
                            lost = expected - n,
                            "outcomes not recorded: partition lease lost to another relay"
                        );
                    }
                    break;
                }
                Err(error) => {
                    self.metrics.database_errors.inc();
                    let alive = fences.iter().any(|(p, e)| self.leases.is_valid(*p, *e));
                    if !alive {
                        tracing::warn!(%error, "could not record outcomes and the leases lapsed");
                        break;
                    }
                    let delay = backoff.next();
                    tracing::warn!(%error, ?delay, "could not record outcomes; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
        done
    }
}

#[derive(Debug, Default)]
struct BatchDone {
    partitions: Vec<i32>,
    /// Bytes the batch held in memory, given back to the budget.
    bytes: i64,
    published: usize,
    dead: usize,
    transient: usize,
}

/// Doubles the batch while claims come back full; halves it when they come back under a
/// quarter full.
fn adapt(current: i64, got: usize, config: &RelayConfig) -> i64 {
    let got = got as i64;
    let next = if got >= current {
        current * 2
    } else if got < current / 4 {
        current / 2
    } else {
        current
    };
    next.clamp(config.min_batch_size, config.max_batch_size)
}

/// Samples the backlog gauges (G7).
async fn sample_stats(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    every: Duration,
    answer_within: Duration,
    shutdown: CancellationToken,
) {
    loop {
        match within(answer_within, store.backlog()).await {
            Ok(b) => {
                health.database_ok();
                health.pending(b.pending);
                metrics.pending.set(b.pending);
                metrics.dead.set(b.dead);
                metrics
                    .oldest_pending_age
                    .set(b.oldest_age.map_or(0.0, |a| a.as_secs_f64()));
            }
            Err(error) => {
                metrics.database_errors.inc();
                tracing::warn!(%error, "could not sample the backlog");
            }
        }
        match within(answer_within, store.release_stale()).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                rows = n,
                "set free rows waiting behind a hold that is gone (a release raced another writer)"
            ),
            Err(error) => {
                metrics.database_errors.inc();
                tracing::warn!(%error, "could not check for rows waiting behind a released hold");
            }
        }
        match within(answer_within, store.refresh_statistics()).await {
            Ok(true) => tracing::info!("refreshed the outbox table's planner statistics"),
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "could not refresh planner statistics"),
        }
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// The relay's upkeep (PostgreSQL), every `every`: on a time-partitioned outbox, creates the
/// partitions a week ahead and, with a retention, drops expired partitions that hold only
/// published events; then, with a retention, deletes published rows older than it in batches
/// of 1000. Never touches pending or dead rows.
async fn maintain_periodically(
    admin: crate::admin::Admin,
    retention: Option<Duration>,
    every: Duration,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
        first = false;
        match admin.create_partitions_ahead().await {
            Ok(created) if !created.is_empty() => {
                tracing::info!(?created, "created time partitions ahead");
            }
            Ok(_) => {}
            Err(error) => {
                metrics.database_errors.inc();
                tracing::warn!(%error, "creating time partitions failed; will retry");
            }
        }
        let Some(retention) = retention else {
            continue;
        };
        match admin.drop_expired_partitions(retention, false, false).await {
            Ok(report) => {
                for (name, rows) in &report.dropped {
                    metrics.purged.inc_by(*rows as u64);
                    tracing::info!(partition = %name, rows, "dropped expired time partition");
                }
                if !report.kept.is_empty() {
                    tracing::info!(kept = ?report.kept,
                        "expired time partitions kept: they still hold pending or dead events");
                }
                if !report.busy.is_empty() {
                    tracing::info!(busy = ?report.busy,
                        "expired time partitions left for the next run: another relay was \
                         dropping partitions, or a transaction was using the events table");
                }
            }
            Err(error) => {
                metrics.database_errors.inc();
                tracing::warn!(%error, "dropping expired time partitions failed; will retry");
            }
        }
        let mut last = 0;
        let purged = admin
            .purge(retention, 1000, false, |total| {
                metrics.purged.inc_by(total - last);
                last = total;
            })
            .await;
        match purged {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, ?retention, "purged published events"),
            Err(error) => {
                metrics.database_errors.inc();
                tracing::warn!(%error, "purge failed; will retry");
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_size_adapts_to_the_backlog() {
        let c = RelayConfig::default();
        assert_eq!(adapt(50, 50, &c), 100);
        assert_eq!(adapt(800, 800, &c), 1000);
        assert_eq!(adapt(1000, 100, &c), 500);
        assert_eq!(adapt(100, 60, &c), 100);
        assert_eq!(adapt(50, 0, &c), 50);
    }
}
