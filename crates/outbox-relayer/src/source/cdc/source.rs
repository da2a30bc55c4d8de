//! The CDC loop: wait for the exclusive lease, catch up from the table, stream, publish,
//! settle, confirm. The design is in the module docs ([`crate::source::cdc`]).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use pgwire_replication::Lsn;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    assembler::{Assembler, Step},
    context::{retry, ChunkWork, Context, End, Held, Key, Streamed},
    db::{SlotState, WalStream},
    inflight::InFlight,
    marks::Marks,
    messages::heartbeat_prefix,
    resumes::Resumptions,
};
use crate::{
    error::Error,
    publisher::PublishError,
    retry::{jittered, Backoff},
    store::{ClaimedRow, Fence},
};

/// The shortest silence of the replication stream taken for a dead connection (three
/// heartbeat intervals otherwise).
const SILENCE_FLOOR: Duration = Duration::from_secs(10);

/// Runs the CDC source until `shutdown`.
pub(crate) async fn run(ctx: Context, shutdown: CancellationToken) -> Result<(), Error> {
    let ctx = Arc::new(ctx);
    let names = names(&ctx).await?;
    if let Some(error) = slot_elsewhere(&ctx, names.slot.as_str()).await {
        return Err(error);
    }
    tokio::spawn(super::slot::sample_slot(
        ctx.clone(),
        names.slot.as_str().to_owned(),
        shutdown.clone(),
    ));
    let mut pause = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut waiting_logged = false;
    loop {
        ctx.health.loop_turned();
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
                biased;
                () = shutdown.cancelled() => return Ok(()),
                () = ctx.leases.changed() => {}
                () = tokio::time::sleep(ctx.config.heartbeat_interval) => {}
            }
            continue;
        }
        waiting_logged = false;
        let mut session = Session::new(ctx.clone(), fences, shutdown.clone());
        let end = session
            .run(names.slot.as_str(), names.publication.as_str(), &shutdown)
            .await;
        ctx.metrics.cdc_streaming.set(0);
        match end {
            End::Stop => return Ok(()),
            End::LeaseLost => {
                tracing::warn!("lease lost: stopped streaming; standing by");
                // Another relay streams the slot now: its gauge tells the lag.
                ctx.unconfirmed.clear();
                // Until the heartbeat's next renewal, the leases would be offered again and a
                // new session, fenced off at once, would republish its first batch.
                ctx.leases.expire_all();
                pause.reset();
            }
            End::Failed(error) => {
                ctx.metrics.database_errors.inc();
                // Work not done: sessions that keep failing, with nothing published for the
                // stall timeout, read as stalled.
                ctx.health.saw_work();
                // The slot may have been made meanwhile for another database (after this
                // relay's slot was dropped): its sessions would fail for ever.
                if let Some(error) = slot_elsewhere(&ctx, names.slot.as_str()).await {
                    return Err(error);
                }
                let delay = jittered(&mut pause);
                tracing::warn!(error = %error.chain(), ?delay, "CDC stream failed; reconnecting");
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// The slot and publication to stream: as configured, else the set-up `outbox migrate --cdc`
/// recorded for this outbox (which may have given the slot a name of its own, another
/// database of the cluster having the default one), else the defaults.
async fn names(ctx: &Context) -> Result<outbox::postgres::cdc::CdcNames, Error> {
    let config = &ctx.config;
    let recorded = if config.cdc.slot.is_some() {
        Vec::new()
    } else {
        let mut pause = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            match ctx.db.recorded_slots().await {
                Ok(recorded) => break recorded,
                Err(error) => {
                    ctx.metrics.database_errors.inc();
                    let delay = jittered(&mut pause);
                    tracing::warn!(%error, ?delay, "could not read the CDC set-up; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    };
    outbox::postgres::cdc::CdcNames::choose(
        &ctx.tables,
        config.cdc.slot.as_deref(),
        config.cdc.publication.as_deref(),
        &recorded,
        None,
    )
    .map_err(Error::Outbox)
}

/// The error to stop with when `slot` belongs to another database of the cluster: a slot of
/// this name made for an outbox there streams that database's changes, and is never adopted.
/// `None` when it is this database's, missing, or cannot be read now (a missing slot or an
/// unreachable database is the session's to report and retry).
async fn slot_elsewhere(ctx: &Context, slot: &str) -> Option<Error> {
    let Ok(Some(SlotState {
        elsewhere: Some((other, here)),
        ..
    })) = ctx.db.slot(slot).await
    else {
        return None;
    };
    Some(Error::Config(format!(
        "replication slot {slot} belongs to database {other}, and this outbox is in database \
         {here}: give this outbox a slot of its own (`outbox migrate --cdc --slot NAME`, then \
         `[relay.cdc] slot = \"NAME\"`)"
    )))
}

/// Longest wait, on a graceful stop, for the client to report the confirmed position.
const REPORT_ON_STOP: Duration = Duration::from_secs(1);

/// Waits until the replication client has reported `applied` to the server (it sends the
/// confirmed position once per status interval): a stream closed before that would leave the
/// slot behind, and the next session would publish the confirmed tail again.
async fn report_applied(client: &dyn WalStream, applied: Lsn) {
    let deadline = Instant::now() + REPORT_ON_STOP;
    while client.reported_lsn() < applied && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One streaming session under one set of leases.
pub(super) struct Session {
    pub(super) ctx: Arc<Context>,
    pub(super) fences: Vec<Fence>,
    pub(super) held: HashMap<Key, Held>,
    pub(super) circuit: Backoff,
    pub(super) holds_loaded_at: Option<Instant>,
    /// Marks being written, in stream order, with the positions they confirm.
    pub(super) marks: Marks,
    /// While a chunk of an open transaction is processed: what it leaves for the commit.
    pub(super) chunk: Option<ChunkWork>,
    /// Batches being published.
    pub(super) inflight: InFlight,
    /// The newest position handed to the replication client as confirmed.
    pub(super) applied: Lsn,
    /// The relay's shutdown, for waits of unbounded length inside a step of the stream.
    pub(super) stop: CancellationToken,
    /// Held aggregates being published from the table.
    pub(super) resumptions: Resumptions,
    /// Destinations whose last publish got no answer in time: the stream hands their events
    /// to the table path (never waiting on them) until one of theirs is acknowledged.
    pub(super) unanswered: HashSet<String>,
}

impl Session {
    fn new(ctx: Arc<Context>, fences: Vec<Fence>, stop: CancellationToken) -> Self {
        let marks = Marks::new(ctx.clone(), fences.clone());
        Self {
            ctx,
            fences,
            held: HashMap::new(),
            circuit: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            holds_loaded_at: None,
            marks,
            chunk: None,
            inflight: InFlight::default(),
            applied: Lsn::default(),
            stop,
            resumptions: Resumptions::default(),
            unanswered: HashSet::new(),
        }
    }

    /// Confirms the stream up to `lsn` (the client reports it within its status interval).
    fn apply(&mut self, client: &dyn WalStream, lsn: Lsn) {
        self.applied = self.applied.max(lsn);
        client.update_applied_lsn(lsn);
    }

    /// Whether nothing streamed is left to publish, mark or confirm.
    fn settled(&self) -> bool {
        self.marks.is_empty() && self.inflight.is_empty()
    }

    pub(super) fn lease_ok(&self) -> bool {
        self.fences
            .iter()
            .all(|(p, e)| self.ctx.leases.is_valid(*p, *e))
    }

    async fn run(&mut self, slot: &str, publication: &str, shutdown: &CancellationToken) -> End {
        if let Err(end) = self.catch_up(slot, shutdown).await {
            return end;
        }
        if let Err(e) = self.reload_holds().await {
            return End::failed("loading holds", e);
        }
        // A walsender left by a relay whose lease expired (paused, partitioned) still holds
        // the slot: this relay owns the lease now, so it ends that session.
        match self
            .ctx
            .db
            .terminate(&self.ctx.relay_id, &self.fences, slot)
            .await
        {
            Ok(true) => {}
            Ok(false) => return End::LeaseLost,
            Err(e) => return End::failed("ending the previous streamer", e),
        }
        let application = format!("outbox-relay {}", self.ctx.relay_id);
        let mut client = match self.ctx.db.replicate(slot, publication, &application).await {
            Ok(c) => c,
            Err(e) => return End::failed("starting replication", e),
        };
        // A slot created (`outbox migrate --cdc`) after the catch-up found no record of it,
        // and before the stream opened: the rows that predate it go out first, from the table,
        // in the next session.
        match self.ctx.db.catch_up_max_id(slot).await {
            Ok(None) => {}
            Ok(Some(_)) => {
                client.abort();
                return End::failed_because("the slot was created meanwhile: catching up first");
            }
            Err(e) => {
                client.abort();
                return End::failed("reading the slot record", e);
            }
        }
        let end = self.stream(client.as_mut(), shutdown).await;
        match end {
            End::Stop => {
                report_applied(client.as_ref(), self.applied).await;
                client.shutdown().await;
            }
            _ => client.abort(),
        }
        end
    }

    /// Streams until the session ends: receives the stream's messages into whole
    /// transactions (the [`Assembler`]), publishes them in batches (a very large transaction
    /// in chunks before its commit), marks and confirms what settled, and does the upkeep of
    /// held aggregates between batches.
    async fn stream(&mut self, client: &mut dyn WalStream, shutdown: &CancellationToken) -> End {
        let heartbeat_prefix = heartbeat_prefix(&self.ctx.tables);
        let mut stream = Assembler::new(&self.ctx.tables, self.ctx.config.max_batch_size as usize);
        let mut last_activity = Instant::now();
        // How long the stream has been waited on without a message since the last one: the
        // server sends keepalives, and the relay's heartbeats come back through it, so a
        // stream silent for longer than `silence_limit` is a connection that no longer
        // carries anything (a half-open socket, a proxy that stopped forwarding), however
        // healthy it looks. The session then fails and reconnects.
        let mut silent = Duration::ZERO;
        let silence_limit = (self.ctx.config.cdc.heartbeat_interval * 3).max(SILENCE_FLOOR);
        let mut started = false;
        loop {
            self.ctx.health.loop_turned();
            if !self.lease_ok() {
                return End::LeaseLost;
            }
            // Publish what has arrived when the stream has nothing more at once (or a
            // transaction is too large to hold).
            let received = if !stream.gathered() || stream.in_transaction() {
                let idle = self.next_wake(last_activity);
                let waiting = Instant::now();
                let received = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => {
                        // Confirm what was published before going.
                        if self.finish_all(shutdown).await.is_ok()
                            && self.marks.reap(true).await.is_ok()
                        {
                            if let Some(lsn) = self.marks.take_confirm() {
                                self.apply(client, lsn);
                            }
                        }
                        return End::Stop;
                    }
                    r = client.recv() => Some(r),
                    () = self.marks.running_done(), if self.marks.is_running() => None,
                    () = self.inflight.front_done(), if !self.inflight.is_empty() => None,
                    () = self.resumptions.any_done(), if !self.resumptions.is_empty() => None,
                    () = tokio::time::sleep(idle) => None,
                };
                if received.is_none() {
                    silent += waiting.elapsed();
                    if silent >= silence_limit {
                        return End::failed_because(
                            "the replication stream carried nothing, not even the relay's \
                             heartbeats, for 3 heartbeat intervals",
                        );
                    }
                }
                received
            } else {
                let linger = self.ctx.config.cdc.batch_linger;
                tokio::time::timeout(linger, client.recv()).await.ok()
            };
            // The table-path work a chunked transaction left for its commit.
            let mut commit_spills = Vec::new();
            let flush_now = match received {
                None => true,
                Some(Err(e)) => return End::failed("receiving the stream", e),
                Some(Ok(None)) => return End::failed_because("the server ended the stream"),
                Some(Ok(Some(message))) => {
                    if !started {
                        started = true;
                        self.ctx.metrics.cdc_streaming.set(1);
                        tracing::info!("streaming the slot");
                    }
                    last_activity = Instant::now();
                    silent = Duration::ZERO;
                    match stream.receive(message) {
                        Step::Received => false,
                        Step::Ignored => continue,
                        Step::Unreadable(bad) => {
                            if let Err(end) = self.unreadable_row(bad).await {
                                return end;
                            }
                            false
                        }
                        Step::Idle(lsn) => {
                            if self.settled() {
                                self.apply(client, lsn);
                            }
                            false
                        }
                        Step::Committed(committed) => {
                            self.marks.add(committed.published);
                            commit_spills = committed.spills;
                            if let Some(at) = committed.streamed {
                                self.ctx.unconfirmed.streamed(at);
                            }
                            committed.batch_full
                        }
                        Step::Failed(end) => return end,
                    }
                }
            };
            // A chunked transaction's table path, now that its deletes are known: before
            // anything of it after its last chunk.
            if !commit_spills.is_empty() {
                if let Err(end) = self.spill_at_commit(commit_spills).await {
                    return end;
                }
            }
            // A very large transaction: publish its events so far (it is confirmed, and its
            // rows marked, after its commit).
            if let Err(end) = self.publish_chunk(&mut stream, shutdown).await {
                return end;
            }
            if flush_now && !stream.in_transaction() {
                if let Err(end) = self.flush(&mut stream, shutdown).await {
                    return end;
                }
            }
            if let Err(end) = self.finish_ready(shutdown).await {
                return end;
            }
            if let Err(end) = self.finish_resumed().await {
                return end;
            }
            if let Err(end) = self.marks.reap(false).await {
                return end;
            }
            if let Some(lsn) = self.marks.take_confirm() {
                self.apply(client, lsn);
                if self.settled() {
                    self.ctx.unconfirmed.clear();
                }
            }
            // Between batches, or when due although the stream never pauses (keepalives or
            // other traffic arriving faster than the idle wake): held aggregates must resume.
            if flush_now || self.upkeep_due() {
                if let Err(end) = self.upkeep(last_activity, &heartbeat_prefix).await {
                    return end;
                }
            }
        }
    }

    /// Publishes the events of the open transaction so far when it grew past the chunk
    /// bounds: the whole transactions gathered before it go out first (G4), and only this
    /// chunk's rows are deferred to its commit; earlier batches settle first.
    async fn publish_chunk(
        &mut self,
        stream: &mut Assembler,
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        let Some(chunk) = stream.take_chunk(self.ctx.config.cdc.max_transaction_events) else {
            return Ok(());
        };
        self.flush(stream, shutdown).await?;
        self.finish_all(shutdown).await?;
        let work = stream
            .chunk_work()
            .expect("a chunk is of an open transaction");
        self.chunk = Some(std::mem::take(work));
        let mut processed = self.publish(chunk, None, shutdown).await;
        if processed.is_ok() {
            processed = self.finish_all(shutdown).await;
        }
        *stream.chunk_work().expect("still open") = self.chunk.take().unwrap_or_default();
        processed
    }

    /// Publishes the whole transactions the stream gathered, confirmed at the end of the last
    /// once settled (at once when they hold no event).
    async fn flush(
        &mut self,
        stream: &mut Assembler,
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        let (events, end) = stream.take_batch();
        if !events.is_empty() {
            self.publish(events, end, shutdown).await?;
        } else if let Some(lsn) = end {
            self.confirm_after(lsn);
        }
        Ok(())
    }

    /// Whether upkeep is due: the holds were not read for a second, or a held aggregate is
    /// due.
    fn upkeep_due(&self) -> bool {
        let now = Instant::now();
        self.holds_loaded_at
            .is_none_or(|t| now >= t + Duration::from_secs(1))
            || self
                .held
                .iter()
                .any(|(k, h)| h.due.is_some_and(|d| d <= now) && self.resumable(k))
    }

    /// Whether held aggregate `key` may be published from the table now: not already, and
    /// with none of its events in a batch the stream is publishing (its order would not hold).
    fn resumable(&self, key: &Key) -> bool {
        !self.resumptions.busy(key) && !self.inflight.may_hold(key)
    }

    /// How long the idle stream may wait before upkeep is due.
    fn next_wake(&self, last_activity: Instant) -> Duration {
        let now = Instant::now();
        let mut wake = now + Duration::from_secs(1);
        wake = wake.min(last_activity + self.ctx.config.cdc.heartbeat_interval);
        for (k, h) in &self.held {
            if let Some(due) = h.due.filter(|_| self.resumable(k)) {
                wake = wake.min(due);
            }
        }
        wake.saturating_duration_since(now)
            .max(Duration::from_millis(5))
    }

    /// Between batches: reload holds, start publishing held aggregates that are due, write a
    /// heartbeat when idle.
    async fn upkeep(&mut self, last_activity: Instant, heartbeat_prefix: &str) -> Result<(), End> {
        if self
            .holds_loaded_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.reload_holds()
                .await
                .map_err(|e| End::failed("loading holds", e))?;
        }
        let now = Instant::now();
        let mut due: Vec<Key> = self
            .held
            .iter()
            .filter(|(k, h)| h.due.is_some_and(|d| d <= now) && self.resumable(k))
            .map(|(k, _)| k.clone())
            .collect();
        // In a fixed order (the map's is random): the same stream resumes the same way. One
        // resumption each: an aggregate whose destination hangs holds up no other one.
        due.sort_unstable();
        for key in due {
            self.start_resume(vec![key]).await?;
        }
        if last_activity.elapsed() >= self.ctx.config.cdc.heartbeat_interval {
            self.ctx
                .db
                .heartbeat(heartbeat_prefix)
                .await
                .map_err(|e| End::failed("writing a heartbeat", e))?;
        }
        Ok(())
    }

    pub(super) fn observe_published(&self, e: &Streamed, destination: &str, at: Instant) {
        let clock = crate::complete::Clock::now();
        self.ctx
            .completer
            .observe_published(&clock, destination, e.row.occurred_at, at);
    }

    pub(super) fn destination_of(&self, row: &ClaimedRow) -> String {
        self.ctx.config.routing.route(
            row.destination.as_deref(),
            &row.aggregate_type,
            &row.event_type,
            row.schema_version,
        )
    }

    pub(super) fn count_failure(&self, e: &Streamed, error: &PublishError) {
        self.ctx
            .completer
            .count_failure(&self.destination_of(&e.row), error);
    }

    /// Retries a database statement with backoff while the lease lasts.
    pub(super) async fn retry_db<T, F, Fut>(&self, f: F) -> Result<T, End>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
    {
        retry(&self.ctx, &self.fences, f).await
    }
}
