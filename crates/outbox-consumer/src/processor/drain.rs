//! The drain: applies an aggregate's held events in its order as their turn comes.
//!
//! Each held event goes through two transactions, both under the aggregate's state row lock
//! (held events without an aggregate: under their own row's lock). The first chooses the
//! event the gate lets through next and counts a try as started, and commits: a try that
//! never ends (the process killed during it) still counts, so an event that crashes its
//! consumer is dead-lettered after [`UNFINISHED_TRIES`] instead of crashing it forever. The
//! second chooses again (another runner may have drained the aggregate meanwhile), runs the
//! handler and, in the same transaction, records the version, deletes the held row and makes
//! the next one due. A failure is counted on the row and tried again after the backoff; after
//! `max_attempts` failures the event is dead-lettered (its aggregate, when the gate orders it,
//! then waits for its replay, as with any gap).
//!
//! A drain runs on one connection, taken from the pool before its first transaction and kept
//! until it ends: once a try is counted, nothing the drain still has to do waits for the pool,
//! so a busy pool (every connection taken by deliveries) cannot leave a try counted that never
//! ran, nor a failure unrecorded. A pool of one connection drains too. When that connection
//! itself dies during a try, the try is taken back on another. The dead letters of the events
//! a drain gave up are stored after it has given its connection back: a dead-letter
//! destination slow to confirm holds no connection that deliveries need.

use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::{Connection, PgConnection};

use super::Processor;
use crate::{
    gate::decide::{self, Decision},
    metrics::Count,
    store::{Aggregate, Due, Held, Leaving},
    ConsumerConfig, HandlerError, Message,
};

/// How long a given-up event's dead letter is left to the runner that gave it up before any
/// sweep stores it.
const BURY_GRACE: Duration = Duration::from_secs(30);

/// How long a held event is put off after its try met an outage.
const OUTAGE_DELAY: Duration = Duration::from_secs(1);

/// Due aggregates taken per sweep; a full batch is followed at once by the next.
const DUE_BATCH: i64 = 64;

/// Tries started and never ended (the process stopped or crashed during each) after which a
/// held event is dead-lettered. A try that meets an outage is not counted, unless the database
/// itself is the one down (its count cannot be taken back then): a few database outages in
/// the middle of one event's tries are not enough to dead-letter it.
pub(crate) const UNFINISHED_TRIES: i32 = 10;

/// Where a consumer's dead letters go: its broker's dead-letter destination (each runner has
/// one), or what a program that applies messages itself chooses.
pub trait DeadLetters: Sync {
    /// Stores `message` as a dead letter, with why, after how many attempts and, as headers,
    /// where it was read (`origin`: a Kafka partition and offset); `Ok` once the broker
    /// confirmed it. The error says what failed (the event stays held, or the delivery in
    /// hand, and is tried again).
    fn dead_letter<'a>(
        &'a self,
        message: &'a Message,
        reason: &'a str,
        attempts: u32,
        origin: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// How a runner retries held events, and where they go when they fail for good.
pub(crate) struct Retry<'a> {
    pub(crate) config: &'a ConsumerConfig,
    pub(crate) dead: &'a dyn DeadLetters,
}

/// One drain's connection, and the events it gave up: their dead letters are stored once the
/// connection is back in the pool.
struct Session<'c> {
    conn: &'c mut PgConnection,
    given_up: Vec<GivenUp>,
}

/// An event given up (no longer held, its row dead), its dead letter not stored yet.
struct GivenUp {
    held: Held,
    reason: String,
    attempts: u32,
}

/// What the first transaction chose.
enum Choice {
    /// Nothing to do now: nothing held, a gap, or a retry not due.
    Nothing,
    /// This event's try starts (counted).
    Try(Held),
    /// Dead-letter this event: it failed for good.
    Dead(Held, String),
    /// Dead-letter this event: below its aggregate's start (its start stays).
    BelowStart(Held, String),
    /// One event cleared (a stale version): look again.
    Again,
}

impl Processor {
    /// Applies the held events that are due now, each aggregate's in its order, up to one
    /// batch (64 aggregates, `config.concurrency` at once); dead-letters to `dead` those that
    /// failed `config.max_attempts` times. Returns whether the batch was full (more may be
    /// due: call again). Runners call this every `config.sweep_interval`; a program that
    /// calls [`Processor::apply`] itself calls it the same way.
    pub async fn apply_due(
        &self,
        config: &ConsumerConfig,
        dead: &dyn DeadLetters,
    ) -> Result<bool, HandlerError> {
        use futures::StreamExt;
        let retry = Retry { config, dead };
        let (due, full) = self.due_now().await?;
        futures::stream::iter(due)
            .for_each_concurrent(config.concurrency, |due| {
                let retry = &retry;
                async move { self.apply_one(&due, retry).await }
            })
            .await;
        Ok(full)
    }

    /// What is due now, up to one batch, the longest due first; and whether the batch is full
    /// (more may be due).
    pub(crate) async fn due_now(&self) -> Result<(Vec<Due>, bool), HandlerError> {
        let due = self.store().due(&self.pool, DUE_BATCH).await?;
        let full = due.len() as i64 == DUE_BATCH;
        Ok((due, full))
    }

    /// Applies one due thing: an aggregate's due events, an event without an aggregate, or a
    /// given-up event's dead letter. A failure is logged: it stays due for a later sweep.
    pub(crate) async fn apply_one(&self, due: &Due, retry: &Retry<'_>) {
        let result = match due {
            Due::Aggregate(aggregate) => self.drain(aggregate, retry).await,
            Due::Lone(id) => self.drain_lone(*id, retry).await,
            Due::Dead(id) => self.send_dead(*id, retry).await,
        };
        if let Err(error) = result {
            tracing::warn!(%error, consumer = self.name(), ?due,
                "held events not applied yet; tried again at the next sweep");
        }
    }

    /// Applies `aggregate`'s held events whose turn has come, in order, until one must wait
    /// (a gap, a retry not due yet, a failure). An error is the database's: the events stay
    /// due and the runner's next sweep tries again.
    pub(crate) async fn drain(
        &self,
        aggregate: &Aggregate,
        retry: &Retry<'_>,
    ) -> Result<(), HandlerError> {
        let mut pooled = self.pool.acquire().await?;
        let mut s = Session {
            conn: &mut pooled,
            given_up: Vec::new(),
        };
        let drained = async {
            loop {
                let choice = self
                    .chosen(s.conn, Some(aggregate), None, retry.config)
                    .await?;
                let again = match choice {
                    Choice::Nothing => false,
                    Choice::Again => true,
                    Choice::Dead(held, reason) => {
                        let attempts = held.attempts as u32;
                        self.bury(&mut s, Some(aggregate), &held, &reason, attempts, true)
                            .await?
                    }
                    Choice::BelowStart(held, reason) => {
                        let attempts = held.attempts as u32;
                        self.bury(&mut s, Some(aggregate), &held, &reason, attempts, false)
                            .await?
                    }
                    Choice::Try(held) => {
                        self.try_held(&mut s, Some(aggregate), held, retry).await?
                    }
                };
                if !again {
                    return Ok(());
                }
            }
        }
        .await;
        let given_up = s.given_up;
        drop(pooled);
        self.store_dead_letters(given_up, retry).await;
        drained
    }

    /// Applies held event `id`, which has no aggregate, if it is due and no other runner has
    /// it.
    pub(crate) async fn drain_lone(&self, id: i64, retry: &Retry<'_>) -> Result<(), HandlerError> {
        let mut pooled = self.pool.acquire().await?;
        let mut s = Session {
            conn: &mut pooled,
            given_up: Vec::new(),
        };
        let drained = match self.chosen(s.conn, None, Some(id), retry.config).await {
            Err(e) => Err(e),
            Ok(Choice::Nothing | Choice::Again) => Ok(()),
            Ok(Choice::Dead(held, reason) | Choice::BelowStart(held, reason)) => {
                let attempts = held.attempts as u32;
                self.bury(&mut s, None, &held, &reason, attempts, false)
                    .await
                    .map(drop)
            }
            Ok(Choice::Try(held)) => self.try_held(&mut s, None, held, retry).await.map(drop),
        };
        let given_up = s.given_up;
        drop(pooled);
        self.store_dead_letters(given_up, retry).await;
        drained
    }

    /// The first transaction: the event to try next, its try counted.
    async fn chosen(
        &self,
        conn: &mut PgConnection,
        aggregate: Option<&Aggregate>,
        lone: Option<i64>,
        config: &ConsumerConfig,
    ) -> Result<Choice, HandlerError> {
        let mut tx = conn.begin().await?;
        let result = self.choose(&mut tx, aggregate, lone).await;
        let choice = match result {
            Ok(Some((held, Decision::Apply))) => {
                // A retry waits for its backoff; a first-seen aggregate's other events wait
                // for its settle time only until it starts, which it just did.
                if held.later && held.attempts > 0 {
                    Choice::Nothing
                } else if config.attempts_spent(held.attempts) {
                    let error = self.last_error(&held);
                    Choice::Dead(held, error)
                } else if held.tries - held.attempts >= UNFINISHED_TRIES {
                    let reason = format!(
                        "its handler was started {} times without finishing: the process \
                         stopped or crashed during each",
                        held.tries - held.attempts
                    );
                    Choice::Dead(held, reason)
                } else {
                    if let Err(e) = self.store().start_try(&mut tx, held.id).await {
                        let _ = tx.rollback().await;
                        return Err(e);
                    }
                    Choice::Try(held)
                }
            }
            Ok(Some((held, Decision::Stale))) => {
                if let Err(e) = self
                    .store()
                    .leave(&mut tx, held.id, aggregate, Leaving::Dropped)
                    .await
                {
                    let _ = tx.rollback().await;
                    return Err(e);
                }
                self.counts.add(Count::Duplicates);
                Choice::Again
            }
            Ok(Some((held, Decision::BelowStart(why)))) => Choice::BelowStart(held, why),
            Ok(Some((_, Decision::Hold { .. } | Decision::Wait(_)))) | Ok(None) => Choice::Nothing,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e);
            }
        };
        tx.commit().await?;
        Ok(choice)
    }

    /// Under the aggregate's lock (or the lone event's), the held event the gate lets through
    /// next and what to do with it; `None` when nothing is held. At a gap, the aggregate's
    /// events are made to wait (none due until the missing one comes).
    async fn choose(
        &self,
        tx: &mut PgConnection,
        aggregate: Option<&Aggregate>,
        lone: Option<i64>,
    ) -> Result<Option<(Held, Decision)>, HandlerError> {
        let store = self.store();
        let Some(aggregate) = aggregate else {
            let held = store.pick_lone(tx, lone.unwrap_or_default()).await?;
            return Ok(held.map(|held| (held, Decision::Apply)));
        };
        // The held count is not trusted here: whatever rows there are get picked.
        let Some(state) = store.lock_state(tx, aggregate).await? else {
            return Ok(None);
        };
        let start = self.gate.as_ref();
        let expected = start.and_then(|s| s.expected(&state));
        let held = store
            .pick(tx, aggregate, start.is_some(), expected, self.settle())
            .await?;
        let Some(held) = held else {
            if let Some(expected) = expected {
                store
                    .wait(tx, aggregate, &format!("waiting for version {expected}"))
                    .await?;
            }
            return Ok(None);
        };
        let decision = decide::held(start, &state, held.version, held.settled);
        if let Decision::Wait(reason) = &decision {
            match expected {
                Some(_) => store.wait(tx, aggregate, reason).await?,
                None => store.settle(tx, aggregate, self.settle()).await?,
            }
        }
        Ok(Some((held, decision)))
    }

    /// How long a first-seen aggregate waits for earlier versions (zero for other gates).
    fn settle(&self) -> Duration {
        match self.gate {
            Some(crate::gate::Start::FirstSeen { settle }) => settle,
            _ => Duration::ZERO,
        }
    }

    fn last_error(&self, held: &Held) -> String {
        held.last_error
            .clone()
            .unwrap_or_else(|| "no error recorded".to_owned())
    }

    /// The second transaction: `held` applied, if it is still the one to try. Returns whether
    /// the drain goes on with the aggregate.
    async fn try_held(
        &self,
        s: &mut Session<'_>,
        aggregate: Option<&Aggregate>,
        held: Held,
        retry: &Retry<'_>,
    ) -> Result<bool, HandlerError> {
        let started = std::time::Instant::now();
        let store = self.store();
        let mut tx = s.conn.begin().await?;
        let result = async {
            match self.choose(&mut tx, aggregate, Some(held.id)).await? {
                Some((now, Decision::Apply))
                    if now.id == held.id && !(now.later && now.attempts > 0) => {}
                // Another runner took it (or failed it, and it waits for its backoff), or the
                // aggregate moved on: choose again.
                _ => return Ok(None),
            }
            let event = held
                .message
                .decode()
                .map_err(|e| HandlerError::permanent(e.to_string()))
                .and_then(|event| self.current(&event))?;
            let xact = store.xact(&mut tx).await?;
            self.run_handler(&mut tx, &event).await?;
            // The first statement after the handler checks the transaction, before anything is
            // written: a handler that ended it would leave what follows running in
            // transactions of their own. The gate's advance checks it itself.
            match (self.gate, aggregate, held.version) {
                (Some(_), Some(aggregate), Some(version)) => {
                    store
                        .advance(&mut tx, aggregate, true, version, &xact)
                        .await?;
                }
                _ => store.still_open(&mut tx, &xact).await?,
            }
            store
                .leave(&mut tx, held.id, aggregate, Leaving::Applied)
                .await?;
            if let Some(aggregate) = aggregate {
                // The next one due now, so that it is found even if this runner stops here.
                if let Some((next, Decision::Apply)) =
                    self.choose(&mut tx, Some(aggregate), None).await?
                {
                    store.mark_due(&mut tx, next.id).await?;
                }
            }
            Ok(Some(()))
        }
        .await;
        self.counts.observe_handler(started.elapsed().as_secs_f64());
        match result {
            Ok(Some(())) => match tx.commit().await {
                Ok(()) => {
                    self.counts.add(Count::Handled);
                    Ok(true)
                }
                // A deferred constraint, a serialisation failure or a lost connection at
                // COMMIT: the try failed like any other (an outage is not counted).
                Err(e) => self.failed_held(s, aggregate, &held, e.into(), retry).await,
            },
            Ok(None) => {
                tx.rollback().await?;
                self.untry(s.conn, held.id, None).await?;
                Ok(true)
            }
            Err(e) => {
                let _ = tx.rollback().await;
                self.failed_held(s, aggregate, &held, e, retry).await
            }
        }
    }

    /// A try of `held` failed with `error`: an outage is the database's (the event stays due);
    /// the event's own failure is counted and tried again later, or dead-lettered.
    async fn failed_held(
        &self,
        s: &mut Session<'_>,
        aggregate: Option<&Aggregate>,
        held: &Held,
        error: HandlerError,
        retry: &Retry<'_>,
    ) -> Result<bool, HandlerError> {
        self.count_result(Err(&error));
        if error.is_infrastructure() {
            // Not the event's failure, nor a crash: the try does not count, and the event is
            // put off while the outage lasts (when the database is the one down, this fails
            // too, and the try stays counted: a rare miscount, see UNFINISHED_TRIES).
            let _ = self.untry(s.conn, held.id, Some(OUTAGE_DELAY)).await;
            return Err(error);
        }
        if error.is_permanent() {
            let attempts = held.attempts as u32 + 1;
            let keep_start = !error.is_below_start();
            return self
                .bury(s, aggregate, held, error.message(), attempts, keep_start)
                .await;
        }
        let attempts = held.attempts as u32 + 1;
        let backoff = retry.config.backoff(attempts);
        let reason = format!(
            "attempt {attempts} of {} failed; tried again after {}: {}",
            retry.config.max_attempts,
            humantime::format_duration(Duration::from_millis(backoff.as_millis() as u64)),
            error.message()
        );
        tracing::warn!(consumer = self.name(), %error, attempts, "held event failed");
        let recorded = match self
            .store()
            .failed(s.conn, held.id, error.message(), backoff, &reason)
            .await
        {
            Ok(attempts) => Ok(attempts),
            // The drain's connection may be the one that died: once more on another.
            Err(_) => match self.pool.acquire().await {
                Ok(mut conn) => {
                    self.store()
                        .failed(&mut conn, held.id, error.message(), backoff, &reason)
                        .await
                }
                Err(e) => Err(e.into()),
            },
        };
        let attempts = match recorded {
            Ok(attempts) => attempts,
            Err(e) => {
                // The failure is not recorded: neither is the try (when the database is the
                // one down, this fails too, as above).
                let _ = self.untry(s.conn, held.id, Some(OUTAGE_DELAY)).await;
                return Err(e);
            }
        };
        if attempts >= retry.config.max_attempts {
            return self
                .bury(s, aggregate, held, error.message(), attempts, true)
                .await;
        }
        Ok(false)
    }

    /// Gives `held` up for `reason`, after `attempts` failed attempts, for its dead letter to be
    /// stored at the end of the drain (`s.given_up`). Given up first, in its own transaction
    /// (no longer held, its inbox row gone), so that a replay of its dead letter that comes
    /// back at once is applied, never taken for a duplicate; then the dead letter is stored
    /// and the row deleted. When the dead letter cannot be stored (or the runner stops first),
    /// the row stays, dead, and a sweep stores it later. With `keep_start` (the event's own failure, not its place below its
    /// aggregate's start), an aggregate the gate has not started starts no later than it.
    /// Returns whether the drain goes on: an aggregate the gate orders waits for the replay;
    /// one it does not goes on with its next event.
    async fn bury(
        &self,
        s: &mut Session<'_>,
        aggregate: Option<&Aggregate>,
        held: &Held,
        reason: &str,
        attempts: u32,
        keep_start: bool,
    ) -> Result<bool, HandlerError> {
        let attempts = attempts.max(1);
        let mut tx = s.conn.begin().await?;
        let marked = async {
            let start = held.version.filter(|_| keep_start && self.gate.is_some());
            let marked = self
                .store()
                .bury(&mut tx, held.id, aggregate, start, reason, BURY_GRACE)
                .await?;
            // The next one due now, so that it is found even if this runner stops here.
            if let (true, Some(aggregate)) = (marked, aggregate) {
                if let Some((next, Decision::Apply)) =
                    self.choose(&mut tx, Some(aggregate), None).await?
                {
                    self.store().mark_due(&mut tx, next.id).await?;
                }
            }
            Ok::<_, HandlerError>(marked)
        }
        .await;
        let marked = match marked {
            Ok(marked) => marked,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e);
            }
        };
        tx.commit().await?;
        if !marked {
            return Ok(true);
        }
        tracing::error!(
            consumer = self.name(),
            reason,
            attempts,
            "dead-lettering held event"
        );
        s.given_up.push(GivenUp {
            held: held.clone(),
            reason: reason.to_owned(),
            attempts,
        });
        Ok(true)
    }

    /// Takes back a try of held event `id` counted as started, on the
    /// drain's connection, or once more on another when that fails: the drain's connection
    /// may be the one that died.
    async fn untry(
        &self,
        conn: &mut PgConnection,
        id: i64,
        outage: Option<Duration>,
    ) -> Result<(), HandlerError> {
        if self.store().untry(conn, id, outage).await.is_ok() {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await?;
        self.store().untry(&mut conn, id, outage).await
    }

    /// Stores the dead letters of the events a drain gave up, its connection given back.
    async fn store_dead_letters(&self, given_up: Vec<GivenUp>, retry: &Retry<'_>) {
        for g in given_up {
            self.store_dead_letter(&g.held, &g.reason, g.attempts, retry)
                .await;
        }
    }

    /// Stores the dead letter of given-up event `held` and deletes its row; when the broker
    /// does not take it, the row stays for a later sweep (after a backoff).
    async fn store_dead_letter(&self, held: &Held, reason: &str, attempts: u32, retry: &Retry<'_>) {
        match retry
            .dead
            .dead_letter(&held.message, reason, attempts, &[])
            .await
        {
            Ok(()) => {
                self.counts.add(Count::DeadLettered);
                if let Err(e) = self.store().buried(&self.pool, held.id).await {
                    // Stored again by a later sweep: a duplicate dead letter, nothing lost.
                    tracing::warn!(consumer = self.name(), error = %e,
                        "dead letter stored, its row not deleted yet");
                }
            }
            Err(e) => {
                tracing::warn!(consumer = self.name(), error = %e,
                    "dead letter not stored; a sweep stores it later");
                let error = format!("storing its dead letter failed: {e}");
                let _ = self
                    .store()
                    .later(&self.pool, held.id, retry.config.backoff(attempts), &error)
                    .await;
            }
        }
    }

    /// Stores the dead letter of given-up event `id`, whose runner did not (it stopped, or
    /// the broker refused), unless another sweep claimed it first.
    pub(crate) async fn send_dead(&self, id: i64, retry: &Retry<'_>) -> Result<(), HandlerError> {
        let Some(held) = self.store().claim_dead(&self.pool, id, BURY_GRACE).await? else {
            return Ok(());
        };
        let reason = held.last_error.clone().unwrap_or_default();
        self.store_dead_letter(&held, &reason, held.attempts.max(1) as u32, retry)
            .await;
        Ok(())
    }
}
