//! The CDC loop: wait for the exclusive lease, catch up from the table, stream, publish,
//! settle, confirm. The design is in the module docs ([`crate::cdc`]).

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use chrono::{DateTime, Utc};
use outbox::{wal::WalEvent, Tables};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use sqlx::{types::Json, PgPool, Row};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{pgoutput::Change, ReplicationTarget};
use crate::{
    config::{OnDead, RelayConfig},
    dispatcher::{self, Item, Outcome},
    http::Health,
    lease::Leases,
    retry::Backoff,
    store::{named, render_fenced, ClaimedRow, Failure, Fence, Store},
    telemetry::{DestinationLabel, Metrics},
    Error, PublishError, Publisher,
};

/// Everything the CDC loop needs from the relay.
pub(crate) struct Context {
    pub pool: PgPool,
    pub tables: Tables,
    pub store: Arc<dyn Store>,
    pub publisher: Arc<dyn Publisher>,
    pub config: RelayConfig,
    pub leases: Arc<Leases>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub relay_id: String,
    pub target: ReplicationTarget,
    pub max_payload: usize,
}

/// The CDC statements, rendered for one outbox.
struct Sql {
    mark_published: String,
    fence_count: String,
    spill: String,
    hold: String,
    pending_of: String,
    catch_up: String,
    catch_up_max_id: String,
    catch_up_done: String,
    holds: String,
    unpark: String,
    slot: String,
    terminate: String,
    heartbeat: String,
    relay_write: String,
}

impl Sql {
    fn new(tables: &Tables) -> Self {
        let r = |name: &str| render_fenced(tables, named(super::SQL, name));
        Self {
            mark_published: r("mark_published"),
            fence_count: r("fence_count"),
            spill: r("spill"),
            hold: r("hold"),
            pending_of: r("pending_of"),
            catch_up: r("catch_up"),
            catch_up_max_id: r("catch_up_max_id"),
            catch_up_done: r("catch_up_done"),
            holds: r("holds"),
            unpark: r("unpark"),
            slot: r("slot"),
            terminate: r("terminate"),
            heartbeat: r("heartbeat"),
            relay_write: r("relay_write"),
        }
    }
}

/// Why a streaming session ended.
enum End {
    /// Shutdown requested.
    Stop,
    /// The exclusive lease was lost (or never complete): back to standby.
    LeaseLost,
    /// The stream or the database failed: reconnect after a pause.
    Failed(String),
}

/// One streamed event.
#[derive(Debug, Clone)]
struct Streamed {
    /// Position in the stream (orders lanes).
    seq: u64,
    /// The row as the stream carried it; `id` 0 for a table-less event.
    row: ClaimedRow,
    /// Whether the row is in the table (not table-less, not deleted in its transaction).
    in_table: bool,
}

/// An aggregate whose events are in the table path.
#[derive(Debug, Default)]
struct Held {
    /// When to publish it from the table; `None`: parked until an operator acts.
    due: Option<Instant>,
    /// Ids of its rows the stream passed while it was held (they must be seen in the table
    /// before the aggregate goes back to the stream).
    skipped: BTreeSet<i64>,
    /// Since when skipped rows were not found in the table.
    missing_since: Option<Instant>,
}

/// A streamed event to write into the table, with the relay state it gets there.
struct SpillRow<'a> {
    event: &'a Streamed,
    status: &'static str,
    attempts: i32,
    error: Option<String>,
    backoff: Option<Duration>,
}

/// A transaction being received.
#[derive(Default)]
struct Txn {
    events: Vec<Streamed>,
    deleted: std::collections::HashSet<i64>,
    relay_write: bool,
    commit_time: Option<DateTime<Utc>>,
}

type Key = (String, String);

/// Runs the CDC source until `shutdown`.
pub(crate) async fn run(ctx: Context, shutdown: CancellationToken) -> Result<(), Error> {
    let ctx = Arc::new(ctx);
    let sql = Arc::new(Sql::new(&ctx.tables));
    let names = ctx.config.cdc_names().map_err(Error::Config)?;
    tokio::spawn(sample_slot(
        ctx.clone(),
        sql.clone(),
        names.slot.as_str().to_owned(),
        shutdown.clone(),
    ));
    let mut pause = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut waiting_logged = false;
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let fences = ctx.leases.usable();
        if fences.len() != ctx.store.partitions() as usize {
            if !waiting_logged {
                tracing::info!(
                    "standing by: another relay streams the slot (waiting for every partition lease)"
                );
                waiting_logged = true;
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = ctx.leases.changed() => {}
                () = tokio::time::sleep(ctx.config.heartbeat_interval) => {}
            }
            continue;
        }
        waiting_logged = false;
        let mut session = Session::new(ctx.clone(), sql.clone(), fences);
        let end = session
            .run(names.slot.as_str(), names.publication.as_str(), &shutdown)
            .await;
        ctx.metrics.cdc_streaming.set(0);
        match end {
            End::Stop => return Ok(()),
            End::LeaseLost => {
                tracing::warn!("lease lost: stopped streaming; standing by");
                pause.reset();
            }
            End::Failed(error) => {
                ctx.metrics.database_errors.inc();
                let delay = pause.next();
                tracing::warn!(%error, ?delay, "CDC stream failed; reconnecting");
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// One streaming session under one set of leases.
struct Session {
    ctx: Arc<Context>,
    sql: Arc<Sql>,
    fences: Vec<Fence>,
    held: HashMap<Key, Held>,
    seq: u64,
    circuit: Backoff,
    holds_loaded_at: Option<Instant>,
    /// Commit time of the oldest streamed transaction not yet confirmed.
    unconfirmed_since: Option<DateTime<Utc>>,
}

impl Session {
    fn new(ctx: Arc<Context>, sql: Arc<Sql>, fences: Vec<Fence>) -> Self {
        Self {
            ctx,
            sql,
            fences,
            held: HashMap::new(),
            seq: 0,
            circuit: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            holds_loaded_at: None,
            unconfirmed_since: None,
        }
    }

    fn lease_ok(&self) -> bool {
        self.fences
            .iter()
            .all(|(p, e)| self.ctx.leases.is_valid(*p, *e))
    }

    async fn run(&mut self, slot: &str, publication: &str, shutdown: &CancellationToken) -> End {
        if let Err(end) = self.catch_up(slot, shutdown).await {
            return end;
        }
        if let Err(e) = self.reload_holds().await {
            return End::Failed(format!("loading holds: {e}"));
        }
        // A walsender left by a relay whose lease expired (paused, partitioned) still holds
        // the slot: this relay owns the lease now, so it ends that session.
        if let Err(e) = sqlx::query(&self.sql.terminate)
            .bind(slot)
            .execute(&self.ctx.pool)
            .await
        {
            return End::Failed(format!("ending the previous streamer: {e}"));
        }
        let config = self.ctx.target.config(
            slot,
            publication,
            &format!("outbox-relay {}", self.ctx.relay_id),
        );
        let mut client = match ReplicationClient::connect(config).await {
            Ok(c) => c,
            Err(e) => return End::Failed(format!("starting replication: {e}")),
        };
        let end = self.stream(&mut client, shutdown).await;
        match end {
            End::Stop => {
                let _ = client.shutdown().await;
            }
            _ => client.abort(),
        }
        end
    }

    async fn stream(
        &mut self,
        client: &mut ReplicationClient,
        shutdown: &CancellationToken,
    ) -> End {
        let max_batch = self.ctx.config.max_batch_size as usize;
        let heartbeat_prefix = format!(
            "outbox-heartbeat:{}.{}",
            self.ctx.tables.schema().as_str(),
            self.ctx.tables.events().as_str()
        );
        let relay_prefix = relay_write_prefix(&self.ctx.tables);
        let event_prefix = outbox::wal::prefix(&self.ctx.tables);
        let mut decoder = super::Decoder::new(
            self.ctx.tables.schema().as_str(),
            self.ctx.tables.events().as_str(),
        );
        let mut txn: Option<Txn> = None;
        let mut batch: Vec<Streamed> = Vec::new();
        // End LSN of the last transaction in `batch` (confirmed once the batch is settled).
        let mut batch_end: Option<Lsn> = None;
        let mut last_activity = Instant::now();
        let mut started = false;
        loop {
            if !self.lease_ok() {
                return End::LeaseLost;
            }
            // Publish what has arrived when the stream has nothing more at once (or a
            // transaction is too large to hold).
            let received = if (batch.is_empty() && batch_end.is_none()) || txn.is_some() {
                let idle = self.next_wake(last_activity);
                tokio::select! {
                    () = shutdown.cancelled() => return End::Stop,
                    r = client.recv() => Some(r),
                    () = tokio::time::sleep(idle) => None,
                }
            } else {
                let linger = self.ctx.config.cdc.batch_linger;
                tokio::time::timeout(linger, client.recv()).await.ok()
            };
            let flush_now = match received {
                None => true,
                Some(Err(e)) => return End::Failed(e.to_string()),
                Some(Ok(None)) => return End::Failed("the server ended the stream".into()),
                Some(Ok(Some(event))) => {
                    if !started {
                        started = true;
                        self.ctx.metrics.cdc_streaming.set(1);
                        tracing::info!("streaming the slot");
                    }
                    last_activity = Instant::now();
                    match event {
                        ReplicationEvent::Begin {
                            commit_time_micros, ..
                        } => {
                            txn = Some(Txn {
                                commit_time: pg_time(commit_time_micros),
                                ..Default::default()
                            });
                            false
                        }
                        ReplicationEvent::XLogData { data, .. } => {
                            let Some(t) = txn.as_mut() else { continue };
                            match decoder.decode(&data) {
                                Ok(Change::Inserted(Ok(row))) => {
                                    self.seq += 1;
                                    t.events.push(Streamed {
                                        seq: self.seq,
                                        row: *row,
                                        in_table: true,
                                    });
                                }
                                Ok(Change::Inserted(Err(bad))) => {
                                    if let Err(end) = self.unreadable_row(bad).await {
                                        return end;
                                    }
                                }
                                Ok(Change::Deleted(id)) => {
                                    t.deleted.insert(id);
                                }
                                Ok(Change::Other) => {}
                                Err(e) => return End::Failed(format!("decoding pgoutput: {e}")),
                            }
                            t.events.len() >= max_batch
                        }
                        ReplicationEvent::Message {
                            transactional,
                            lsn,
                            prefix,
                            content,
                        } => {
                            if prefix == event_prefix && transactional {
                                if let Some(t) = txn.as_mut() {
                                    self.seq += 1;
                                    let row = table_less_row(&content, t.commit_time, lsn);
                                    t.events.push(Streamed {
                                        seq: self.seq,
                                        row,
                                        in_table: false,
                                    });
                                }
                            } else if prefix == relay_prefix {
                                if let Some(t) = txn.as_mut() {
                                    t.relay_write = true;
                                }
                            } else if prefix == heartbeat_prefix
                                && !transactional
                                && txn.is_none()
                                && batch.is_empty()
                                && batch_end.is_none()
                            {
                                client.update_applied_lsn(lsn);
                            }
                            false
                        }
                        ReplicationEvent::Commit { end_lsn, .. } => {
                            if let Some(mut t) = txn.take() {
                                // The relay's own writes (rows it spilled) are not events.
                                if !t.relay_write {
                                    for e in &mut t.events {
                                        if e.in_table && t.deleted.contains(&e.row.id) {
                                            e.in_table = false;
                                        }
                                    }
                                    if !t.events.is_empty() && self.unconfirmed_since.is_none() {
                                        self.unconfirmed_since = t.commit_time;
                                    }
                                    batch.append(&mut t.events);
                                }
                            }
                            batch_end = Some(end_lsn);
                            batch.len() >= max_batch
                        }
                        ReplicationEvent::KeepAlive { wal_end, .. } => {
                            if txn.is_none() && batch.is_empty() && batch_end.is_none() {
                                client.update_applied_lsn(wal_end);
                            }
                            false
                        }
                        ReplicationEvent::StoppedAt { .. } => {
                            return End::Failed("the stream stopped".into())
                        }
                    }
                }
            };
            // A transaction larger than a batch: publish its events so far (it is confirmed
            // after its commit).
            if let Some(t) = txn.as_mut() {
                if t.events.len() >= max_batch && !t.relay_write {
                    let mut chunk = std::mem::take(&mut t.events);
                    if let Err(end) = self.process(&mut chunk, shutdown).await {
                        return end;
                    }
                }
            }
            if flush_now && txn.is_none() {
                if !batch.is_empty() {
                    let mut events = std::mem::take(&mut batch);
                    if let Err(end) = self.process(&mut events, shutdown).await {
                        return end;
                    }
                }
                if let Some(lsn) = batch_end.take() {
                    client.update_applied_lsn(lsn);
                    self.unconfirmed_since = None;
                }
            }
            if flush_now {
                if let Err(end) = self.upkeep(last_activity, &heartbeat_prefix).await {
                    return end;
                }
            }
            self.ctx
                .metrics
                .cdc_slot_lag_seconds
                .set(self.unconfirmed_since.map_or(0.0, |t| {
                    (Utc::now() - t).num_milliseconds().max(0) as f64 / 1e3
                }));
        }
    }

    /// How long the idle stream may wait before upkeep is due.
    fn next_wake(&self, last_activity: Instant) -> Duration {
        let now = Instant::now();
        let mut wake = now + Duration::from_secs(1);
        wake = wake.min(last_activity + self.ctx.config.cdc.heartbeat_interval);
        for h in self.held.values() {
            if let Some(due) = h.due {
                wake = wake.min(due);
            }
        }
        wake.saturating_duration_since(now)
            .max(Duration::from_millis(5))
    }

    /// Between batches: reload holds, publish held aggregates that are due, write a
    /// heartbeat when idle.
    async fn upkeep(&mut self, last_activity: Instant, heartbeat_prefix: &str) -> Result<(), End> {
        if self
            .holds_loaded_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.reload_holds()
                .await
                .map_err(|e| End::Failed(format!("loading holds: {e}")))?;
        }
        let now = Instant::now();
        let due: Vec<Key> = self
            .held
            .iter()
            .filter(|(_, h)| h.due.is_some_and(|d| d <= now))
            .map(|(k, _)| k.clone())
            .collect();
        if !due.is_empty() {
            self.resume(due).await?;
        }
        if last_activity.elapsed() >= self.ctx.config.cdc.heartbeat_interval {
            sqlx::query(&self.sql.heartbeat)
                .bind(heartbeat_prefix)
                .execute(&self.ctx.pool)
                .await
                .map_err(|e| End::Failed(format!("writing a heartbeat: {e}")))?;
        }
        Ok(())
    }

    /// Publishes streamed events (in stream order), waits out a failing broker, hands other
    /// failures and held aggregates to the table, marks the published rows.
    async fn process(
        &mut self,
        events: &mut Vec<Streamed>,
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        self.ctx.metrics.batch_size.observe(events.len() as f64);
        self.ctx.health.saw_work();
        let mut todo: Vec<Streamed> = Vec::new();
        let mut behind_held: Vec<Streamed> = Vec::new();
        for e in events.drain(..) {
            if self
                .held
                .contains_key(&(e.row.aggregate_type.clone(), e.row.aggregate_id.clone()))
            {
                behind_held.push(e);
            } else {
                todo.push(e);
            }
        }
        let mut published: Vec<Streamed> = Vec::new();
        let mut failed: Vec<(Streamed, PublishError)> = Vec::new();
        let mut spill_after: Vec<Streamed> = Vec::new();
        let mut rounds = 0;
        while !todo.is_empty() {
            let results = self.dispatch(std::mem::take(&mut todo)).await;
            let mut round_published = 0;
            let mut round_failed: Vec<(Streamed, PublishError)> = Vec::new();
            let mut round_skipped: Vec<Streamed> = Vec::new();
            for (e, outcome) in results {
                match outcome {
                    Outcome::Published(at) => {
                        self.observe_published(&e, at);
                        round_published += 1;
                        published.push(e);
                    }
                    Outcome::Failed(error) => round_failed.push((e, error)),
                    Outcome::Skipped => round_skipped.push(e),
                }
            }
            if round_failed.is_empty() {
                if !round_skipped.is_empty() {
                    // Skipped without a failure: the lease lapsed mid-batch.
                    return Err(End::LeaseLost);
                }
                self.circuit.reset();
                break;
            }
            let all_transient = round_failed.iter().all(|(_, e)| e.is_transient());
            // The broker is failing everything: wait it out here, in order, dead-lettering
            // nothing. A few aggregates failing while others go: hand them to the table.
            if all_transient && (round_published == 0 || rounds < 3) {
                rounds += 1;
                for (e, error) in &round_failed {
                    self.count_failure(e, error);
                }
                let delay = self.circuit.next();
                tracing::warn!(failed = round_failed.len(), ?delay, error = %round_failed[0].1,
                    "broker failing; retrying the batch in place");
                tokio::select! {
                    () = shutdown.cancelled() => return Err(End::Stop),
                    () = tokio::time::sleep(delay) => {}
                }
                if !self.lease_ok() {
                    return Err(End::LeaseLost);
                }
                todo = round_failed.into_iter().map(|(e, _)| e).collect();
                todo.extend(round_skipped);
                todo.sort_by_key(|e| e.seq);
                continue;
            }
            failed = round_failed;
            spill_after = round_skipped;
            break;
        }
        if !published.is_empty() {
            self.ctx.health.progressed();
        }
        self.mark_published(&published, shutdown).await?;
        for (e, error) in failed {
            self.count_failure(&e, &error);
            self.spill_failed(e, &error).await?;
        }
        spill_after.sort_by_key(|e| e.seq);
        behind_held.append(&mut spill_after);
        behind_held.sort_by_key(|e| e.seq);
        self.spill_behind(behind_held).await?;
        Ok(())
    }

    async fn dispatch(&self, events: Vec<Streamed>) -> Vec<(Streamed, Outcome)> {
        let epoch_of = |p: i32| self.fences.iter().find(|f| f.0 == p).map_or(-1, |f| f.1);
        let mut by_seq: HashMap<i64, Streamed> = HashMap::with_capacity(events.len());
        let items: Vec<Item> = events
            .into_iter()
            .map(|e| {
                let max = self.ctx.max_payload;
                let message = if e.row.payload_size > max as i64 {
                    Err(PublishError::permanent(format!(
                        "payload is {} bytes, over the limit of {max} bytes",
                        e.row.payload_size
                    )))
                } else {
                    e.row.decode(&self.ctx.config.routing, max)
                };
                let destination = message
                    .as_ref()
                    .map_or_else(|_| "(undecodable)".to_owned(), |m| m.destination.clone());
                let item = Item {
                    id: e.seq as i64,
                    // Table-less events have no partition: any held lease fences them.
                    partition: e.row.partition,
                    epoch: epoch_of(e.row.partition),
                    attempts: e.row.attempts,
                    key: (e.row.aggregate_type.clone(), e.row.aggregate_id.clone()),
                    destination,
                    message,
                };
                by_seq.insert(e.seq as i64, e);
                item
            })
            .collect();
        dispatcher::dispatch(
            items,
            self.ctx.publisher.clone(),
            self.ctx.leases.clone(),
            self.ctx.config.lane_concurrency,
            self.ctx.config.publish_timeout,
        )
        .await
        .into_iter()
        .map(|(item, outcome)| (by_seq.remove(&item.id).expect("dispatched"), outcome))
        .collect()
    }

    fn observe_published(&self, e: &Streamed, at: Instant) {
        let m = &self.ctx.metrics;
        if let Some(occurred) = e.row.occurred_at {
            let acked = Utc::now() - chrono::Duration::from_std(at.elapsed()).unwrap_or_default();
            let latency = acked - occurred;
            m.latency
                .observe(latency.num_microseconds().unwrap_or(0).max(0) as f64 / 1e6);
        }
        let destination = self.destination_of(&e.row);
        m.published
            .get_or_create(&DestinationLabel {
                destination: m.destination_label(&destination),
            })
            .inc();
    }

    fn destination_of(&self, row: &ClaimedRow) -> String {
        self.ctx.config.routing.route(
            row.destination.as_deref(),
            &row.aggregate_type,
            &row.event_type,
            row.schema_version,
        )
    }

    fn count_failure(&self, e: &Streamed, error: &PublishError) {
        let m = &self.ctx.metrics;
        m.failed
            .get_or_create(&crate::telemetry::FailureLabels {
                destination: m.destination_label(&self.destination_of(&e.row)),
                class: if error.is_transient() {
                    "transient"
                } else {
                    "permanent"
                }
                .into(),
            })
            .inc();
    }

    /// Marks the published rows of the table; a row whose commit reached the stream before
    /// it became visible is marked again shortly after (for up to about two seconds).
    async fn mark_published(
        &self,
        published: &[Streamed],
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        let mut ids: BTreeSet<i64> = published
            .iter()
            .filter(|e| e.in_table)
            .map(|e| e.row.id)
            .collect();
        let mut tries = 0;
        while !ids.is_empty() {
            let list: Vec<i64> = ids.iter().copied().collect();
            let (parts, epochs): (Vec<i32>, Vec<i64>) = self.fences.iter().copied().unzip();
            let marked: Vec<i64> = self
                .retry_db(|| {
                    sqlx::query_scalar(&self.sql.mark_published)
                        .bind(list.clone())
                        .bind(parts.clone())
                        .bind(epochs.clone())
                        .bind(&self.ctx.relay_id)
                        .fetch_all(&self.ctx.pool)
                })
                .await?;
            for id in marked {
                ids.remove(&id);
            }
            if ids.is_empty() {
                break;
            }
            if !self.lease_ok() {
                return Err(End::LeaseLost);
            }
            tries += 1;
            if tries > 20 {
                tracing::warn!(
                    rows = ids.len(),
                    "published rows not found pending in the table \
                    (deleted by another transaction?): left as they are"
                );
                break;
            }
            tokio::select! {
                () = shutdown.cancelled() => return Err(End::Stop),
                () = tokio::time::sleep(Duration::from_millis(5 * tries)) => {}
            }
        }
        Ok(())
    }

    /// Retries a database statement with backoff while the lease lasts.
    async fn retry_db<T, F, Fut>(&self, mut f: F) -> Result<T, End>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
    {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            match f().await {
                Ok(v) => {
                    self.ctx.health.database_ok();
                    return Ok(v);
                }
                Err(error) => {
                    self.ctx.metrics.database_errors.inc();
                    if !self.lease_ok() {
                        return Err(End::LeaseLost);
                    }
                    let delay = backoff.next();
                    tracing::warn!(%error, ?delay, "CDC statement failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Hands a failed event to the table path: attempt, error, hold with backoff, or dead
    /// letter (parking its aggregate).
    async fn spill_failed(&mut self, e: Streamed, error: &PublishError) -> Result<(), End> {
        let policy = &self.ctx.config.retry;
        let attempts = e.row.attempts + 1;
        let dead = policy.is_dead(attempts, error.class);
        let backoff = policy.backoff(attempts, error.class);
        let key: Key = (e.row.aggregate_type.clone(), e.row.aggregate_id.clone());
        if dead {
            tracing::error!(event_id = %e.row.event_id, aggregate_type = %key.0,
                aggregate_id = %key.1, attempts, %error, "event dead-lettered");
            self.ctx
                .metrics
                .dead_lettered
                .get_or_create(&DestinationLabel {
                    destination: self
                        .ctx
                        .metrics
                        .destination_label(&self.destination_of(&e.row)),
                })
                .inc();
            self.ctx.health.progressed();
        } else {
            tracing::debug!(event_id = %e.row.event_id, attempts, %error, "publish failed; handed to the table path");
        }
        self.ctx.metrics.cdc_spilled.inc();
        let park = self.ctx.config.on_dead == OnDead::Park;
        let head_id = if e.in_table {
            let failure = Failure {
                id: e.row.id,
                error: error.to_string(),
                backoff,
                dead,
            };
            let (fences, relay_id, store) = (&self.fences, &self.ctx.relay_id, &self.ctx.store);
            // The row may not be visible yet (its commit reached the stream first).
            for tries in 1..=20u64 {
                let n = self
                    .retry_db(|| {
                        store.mark_failed(relay_id, fences, std::slice::from_ref(&failure), true)
                    })
                    .await?;
                if n > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5 * tries)).await;
            }
            e.row.id
        } else {
            let status = if dead { "dead" } else { "pending" };
            let ids = self
                .write_rows(&[SpillRow {
                    event: &e,
                    status,
                    attempts,
                    error: Some(error.to_string()),
                    backoff: Some(backoff),
                }])
                .await?;
            ids[0]
        };
        // Held until the backoff lapses; parked when dead (or due at once with on_dead = skip,
        // so that the later events go on).
        let wait = if dead {
            (!park).then_some(0.0)
        } else {
            Some(backoff.as_secs_f64())
        };
        if !e.in_table || dead {
            let sql = &self.sql.hold;
            let pool = &self.ctx.pool;
            self.retry_db(|| {
                sqlx::query(sql)
                    .bind(&key.0)
                    .bind(&key.1)
                    .bind(head_id)
                    .bind(wait)
                    .execute(pool)
            })
            .await?;
        }
        let entry = self.held.entry(key).or_default();
        entry.due = wait.map(|w| Instant::now() + Duration::from_secs_f64(w));
        Ok(())
    }

    /// Hands events of held aggregates (in stream order) to the table: rows already there are
    /// noted; the others are written.
    async fn spill_behind(&mut self, events: Vec<Streamed>) -> Result<(), End> {
        if events.is_empty() {
            return Ok(());
        }
        self.ctx.metrics.cdc_spilled.inc_by(events.len() as u64);
        let to_write: Vec<&Streamed> = events.iter().filter(|e| !e.in_table).collect();
        let rows: Vec<SpillRow<'_>> = to_write
            .iter()
            .map(|e| SpillRow {
                event: e,
                status: "pending",
                attempts: e.row.attempts,
                error: None,
                backoff: None,
            })
            .collect();
        let written = if rows.is_empty() {
            Vec::new()
        } else {
            self.write_rows(&rows).await?
        };
        let mut written = written.into_iter();
        for e in &events {
            let id = if e.in_table {
                e.row.id
            } else {
                match written.next() {
                    Some(id) => id,
                    None => continue,
                }
            };
            let key = (e.row.aggregate_type.clone(), e.row.aggregate_id.clone());
            self.held.entry(key).or_default().skipped.insert(id);
        }
        Ok(())
    }

    /// Writes streamed events into the table, fenced, in one transaction marked as the
    /// relay's own (the stream passes over it). Returns their new ids.
    async fn write_rows(&self, rows: &[SpillRow<'_>]) -> Result<Vec<i64>, End> {
        let (parts, epochs): (Vec<i32>, Vec<i64>) = self.fences.iter().copied().unzip();
        let prefix = relay_write_prefix(&self.ctx.tables);
        self.retry_db(|| async {
            let mut tx = self.ctx.pool.begin().await?;
            let held: i64 = sqlx::query_scalar(&self.sql.fence_count)
                .bind(true)
                .bind(&parts)
                .bind(&epochs)
                .bind(&self.ctx.relay_id)
                .fetch_one(&mut *tx)
                .await?;
            if held != parts.len() as i64 {
                return Ok(None);
            }
            sqlx::query(&self.sql.relay_write)
                .bind(&prefix)
                .execute(&mut *tx)
                .await?;
            let ids: Vec<i64> = sqlx::query_scalar(&self.sql.spill)
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.event_id)
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.aggregate_type.clone())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.aggregate_id.clone())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.aggregate_version)
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.event_type.clone())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.schema_version)
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.destination.clone())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.payload.clone().unwrap_or_default())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.content_type.clone())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| Json(x.event.row.headers.clone()))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|x| x.event.row.occurred_at)
                        .collect::<Vec<_>>(),
                )
                .bind(rows.iter().map(|x| x.status.to_owned()).collect::<Vec<_>>())
                .bind(rows.iter().map(|x| x.attempts).collect::<Vec<_>>())
                .bind(rows.iter().map(|x| x.error.clone()).collect::<Vec<_>>())
                .bind(
                    rows.iter()
                        .map(|x| x.backoff.map(|d| d.as_secs_f64()))
                        .collect::<Vec<_>>(),
                )
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Some(ids))
        })
        .await?
        .ok_or(End::LeaseLost)
    }

    /// Reads the holds: aggregates held or parked in the table. One no longer there was
    /// released by an operator (replay, skip): due at once.
    async fn reload_holds(&mut self) -> Result<(), sqlx::Error> {
        let rows = sqlx::query(&self.sql.holds)
            .fetch_all(&self.ctx.pool)
            .await?;
        self.holds_loaded_at = Some(Instant::now());
        let now = Instant::now();
        let mut in_db: HashMap<Key, Option<f64>> = HashMap::with_capacity(rows.len());
        for r in &rows {
            in_db.insert((r.get(0), r.get(1)), r.get(2));
        }
        for (key, h) in self.held.iter_mut() {
            if !in_db.contains_key(key) && h.due.is_none() {
                h.due = Some(now);
            }
        }
        for (key, wait) in in_db {
            let h = self.held.entry(key).or_default();
            h.due = wait.map(|w| now + Duration::from_secs_f64(w.max(0.0)));
        }
        Ok(())
    }

    /// Publishes held aggregates whose hold lapsed from the table, in id order; gives each
    /// back to the stream once nothing of it is pending there.
    async fn resume(&mut self, keys: Vec<Key>) -> Result<(), End> {
        const LIMIT: i64 = 1000;
        let mut items: Vec<ClaimedRow> = Vec::new();
        for key in &keys {
            let sql = &self.sql.pending_of;
            let pool = &self.ctx.pool;
            let max = i32::try_from(self.ctx.max_payload).unwrap_or(i32::MAX);
            let rows: Vec<ClaimedRow> = self
                .retry_db(|| {
                    sqlx::query_as(sql)
                        .bind(&key.0)
                        .bind(&key.1)
                        .bind(LIMIT)
                        .bind(max)
                        .fetch_all(pool)
                })
                .await?;
            items.extend(rows);
        }
        let published_ids: std::collections::HashSet<i64>;
        let mut failures: Vec<Failure> = Vec::new();
        let mut failed_keys: HashMap<Key, Option<Duration>> = HashMap::new();
        {
            let events: Vec<Streamed> = items
                .iter()
                .cloned()
                .map(|row| Streamed {
                    seq: row.id as u64,
                    row,
                    in_table: true,
                })
                .collect();
            let results = self.dispatch(events).await;
            let mut published = Vec::new();
            let policy = &self.ctx.config.retry;
            for (e, outcome) in results {
                match outcome {
                    Outcome::Published(at) => {
                        self.observe_published(&e, at);
                        published.push(e.row.id);
                    }
                    Outcome::Failed(error) => {
                        self.count_failure(&e, &error);
                        let attempts = e.row.attempts + 1;
                        let dead = policy.is_dead(attempts, error.class);
                        let backoff = policy.backoff(attempts, error.class);
                        if dead {
                            tracing::error!(event_id = %e.row.event_id, attempts, %error,
                                "event dead-lettered");
                        }
                        failed_keys.insert(
                            (e.row.aggregate_type.clone(), e.row.aggregate_id.clone()),
                            (!dead).then_some(backoff),
                        );
                        failures.push(Failure {
                            id: e.row.id,
                            error: error.to_string(),
                            backoff,
                            dead,
                        });
                    }
                    Outcome::Skipped => {}
                }
            }
            if !published.is_empty() || !failures.is_empty() {
                self.ctx.health.progressed();
            }
            let (fences, relay_id, store) = (&self.fences, &self.ctx.relay_id, &self.ctx.store);
            if !published.is_empty() {
                // The CDC statement leaves the holds: an aggregate stays with the table path
                // until `unpark` finds nothing of it pending, even across a crash.
                let (parts, epochs): (Vec<i32>, Vec<i64>) = fences.iter().copied().unzip();
                let sql = &self.sql.mark_published;
                let pool = &self.ctx.pool;
                let _: Vec<i64> = self
                    .retry_db(|| {
                        sqlx::query_scalar(sql)
                            .bind(published.clone())
                            .bind(parts.clone())
                            .bind(epochs.clone())
                            .bind(relay_id)
                            .fetch_all(pool)
                    })
                    .await?;
            }
            if !failures.is_empty() {
                let park = self.ctx.config.on_dead == OnDead::Park;
                self.retry_db(|| store.mark_failed(relay_id, fences, &failures, park))
                    .await?;
            }
            published_ids = published.into_iter().collect();
        }
        let now = Instant::now();
        for key in keys {
            let found = items
                .iter()
                .filter(|r| r.aggregate_type == key.0 && r.aggregate_id == key.1)
                .count() as i64;
            let Some(h) = self.held.get_mut(&key) else {
                continue;
            };
            h.skipped.retain(|id| !published_ids.contains(id));
            if let Some(wait) = failed_keys.get(&key) {
                h.due = wait.map(|w| now + w);
                continue;
            }
            if found >= LIMIT {
                h.due = Some(now);
                continue;
            }
            if !h.skipped.is_empty() {
                // Rows the stream passed are not visible yet: look again shortly.
                let since = *h.missing_since.get_or_insert(now);
                if since.elapsed() < Duration::from_secs(10) {
                    h.due = Some(now + Duration::from_millis(20));
                    continue;
                }
                tracing::warn!(aggregate_type = %key.0, aggregate_id = %key.1,
                    rows = h.skipped.len(), "rows the stream carried were not found pending \
                    in the table after 10 s (deleted?): giving the aggregate back to the stream");
            }
            let sql = &self.sql.unpark;
            let pool = &self.ctx.pool;
            let free: bool = self
                .retry_db(|| {
                    sqlx::query_scalar(sql)
                        .bind(&key.0)
                        .bind(&key.1)
                        .fetch_one(pool)
                })
                .await?;
            if free {
                self.held.remove(&key);
            } else if let Some(h) = self.held.get_mut(&key) {
                h.due = Some(now);
            }
        }
        Ok(())
    }

    /// A row whose columns cannot be read at all: dead-lettered by id when it has one.
    async fn unreadable_row(&mut self, bad: super::BadRow) -> Result<(), End> {
        tracing::error!(id = ?bad.id, reason = %bad.reason, "unreadable outbox row in the stream");
        let Some(id) = bad.id else {
            return Ok(());
        };
        let failure = Failure {
            id,
            error: format!("permanent: unreadable row: {}", bad.reason),
            backoff: Duration::ZERO,
            dead: true,
        };
        let (fences, relay_id, store) = (&self.fences, &self.ctx.relay_id, &self.ctx.store);
        self.retry_db(|| store.mark_failed(relay_id, fences, std::slice::from_ref(&failure), true))
            .await?;
        self.reload_holds()
            .await
            .map_err(|e| End::Failed(format!("loading holds: {e}")))
    }

    /// Publishes, from the table, the pending rows that may predate the slot.
    async fn catch_up(&mut self, slot: &str, shutdown: &CancellationToken) -> Result<(), End> {
        let max_id: Option<i64> = sqlx::query_scalar(&self.sql.catch_up_max_id)
            .bind(slot)
            .fetch_optional(&self.ctx.pool)
            .await
            .map_err(|e| End::Failed(format!("reading the slot record: {e}")))?
            .flatten();
        let Some(max_id) = max_id else {
            return Ok(());
        };
        tracing::info!(
            max_id,
            "catching up: publishing rows that may predate the slot"
        );
        let mut total = 0usize;
        loop {
            if shutdown.is_cancelled() {
                return Err(End::Stop);
            }
            let sql = &self.sql.catch_up;
            let pool = &self.ctx.pool;
            let limit = self.ctx.config.max_batch_size;
            let max = i32::try_from(self.ctx.max_payload).unwrap_or(i32::MAX);
            let rows: Vec<ClaimedRow> = self
                .retry_db(|| {
                    sqlx::query_as(sql)
                        .bind(max_id)
                        .bind(limit)
                        .bind(max)
                        .fetch_all(pool)
                })
                .await?;
            if rows.is_empty() {
                break;
            }
            total += rows.len();
            let keys: Vec<Key> = rows
                .iter()
                .map(|r| (r.aggregate_type.clone(), r.aggregate_id.clone()))
                .collect();
            // The table path does exactly this: publish in id order, mark, hold failures.
            for key in &keys {
                self.held.entry(key.clone()).or_default().due = Some(Instant::now());
            }
            let mut unique = keys;
            unique.sort();
            unique.dedup();
            self.resume(unique).await?;
        }
        let sql = &self.sql.catch_up_done;
        let pool = &self.ctx.pool;
        self.retry_db(|| sqlx::query(sql).bind(slot).execute(pool))
            .await?;
        tracing::info!(rows = total, "caught up");
        Ok(())
    }
}

/// The prefix of the marker message in the relay's own writes to the table.
fn relay_write_prefix(tables: &Tables) -> String {
    format!(
        "outbox-relay-write:{}.{}",
        tables.schema().as_str(),
        tables.events().as_str()
    )
}

/// PostgreSQL's timestamps: microseconds since 2000-01-01 UTC.
fn pg_time(micros: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros.checked_add(946_684_800_000_000)?)
}

/// A table-less event as a row (id 0). Content that is not a valid event still becomes a row,
/// under a key of its own, whose decode fails with the reason: it is dead-lettered into the
/// table with its raw bytes, and blocks nothing.
fn table_less_row(content: &[u8], commit_time: Option<DateTime<Utc>>, lsn: Lsn) -> ClaimedRow {
    let decoded = WalEvent::decode(content).and_then(|w| w.payload_bytes().map(|p| (w, p)));
    match decoded {
        Ok((w, payload)) => ClaimedRow {
            id: 0,
            event_id: w.event_id,
            aggregate_type: w.aggregate_type,
            aggregate_id: w.aggregate_id,
            aggregate_version: w.aggregate_version,
            event_type: w.event_type,
            schema_version: w.schema_version,
            destination: w.destination,
            payload_size: payload.len() as i64,
            payload: Some(payload),
            content_type: w.content_type,
            headers: serde_json::to_value(&w.headers).unwrap_or_default(),
            occurred_at: w.occurred_at.or(commit_time),
            partition: 0,
            attempts: 0,
        },
        Err(reason) => ClaimedRow {
            id: 0,
            event_id: uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, content),
            aggregate_type: "outbox.undecodable".into(),
            aggregate_id: lsn.to_string(),
            aggregate_version: None,
            event_type: "Undecodable".into(),
            schema_version: 1,
            destination: None,
            payload_size: content.len() as i64,
            payload: Some(content.to_vec()),
            content_type: "application/octet-stream".into(),
            // Not an object: decode refuses it, naming the reason below.
            headers: serde_json::Value::String(reason),
            occurred_at: commit_time,
            partition: 0,
            attempts: 0,
        },
    }
}

/// Samples the slot: WAL not confirmed, WAL retained, the alarm.
async fn sample_slot(ctx: Arc<Context>, sql: Arc<Sql>, slot: String, shutdown: CancellationToken) {
    let max = ctx.config.cdc.max_retained_wal_bytes;
    let mut alarmed = false;
    loop {
        match sqlx::query(&sql.slot)
            .bind(&slot)
            .fetch_optional(&ctx.pool)
            .await
        {
            Ok(Some(r)) => {
                let lag: Option<i64> = r.get("lag_bytes");
                let retained: Option<i64> = r.get("retained_bytes");
                let retained = retained.unwrap_or(0).max(0);
                ctx.metrics.cdc_slot_lag_bytes.set(lag.unwrap_or(0).max(0));
                ctx.metrics.cdc_retained_wal_bytes.set(retained);
                let over = retained as u64 >= max / 10 * 8;
                ctx.metrics.cdc_retained_wal_alarm.set(i64::from(over));
                if over && !alarmed {
                    tracing::error!(retained_bytes = retained, max_retained_wal_bytes = max,
                        slot = %slot, "replication slot retains over 80% of the allowed WAL: \
                        is the CDC relay stalled? (see docs/operations.md, CDC)");
                }
                alarmed = over;
            }
            Ok(None) => {
                tracing::error!(slot = %slot, "replication slot not found: run `outbox migrate --cdc` \
                    (rows written meanwhile are caught up from the table when it is recreated)");
            }
            Err(error) => tracing::warn!(%error, "could not sample the replication slot"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(ctx.config.stats_interval) => {}
        }
    }
}
