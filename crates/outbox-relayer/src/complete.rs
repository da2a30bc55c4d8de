//! Completion: what became of dispatched events, counted in the metrics and recorded in the
//! outbox. One implementation, used by both sources:
//!
//! * [`Completer::observe_published`], [`Completer::count_failure`], [`Completer::judge`]: the
//!   metrics of an outcome (latency from `occurred_at` to the ack, counters by destination and
//!   failure class, dead letters) and the decision for a failure (`RetryPolicy::failure`:
//!   retry with backoff, or dead letter).
//! * [`Completer::record`]: outcomes written to the table with the one `mark_published` and
//!   `mark_failed` of the store, fenced by the lease epochs; a write the database refuses for
//!   its data is written row by row, so that one refused row leaves the others recorded.
//! * [`Completer::fenced`]: the one retry of a statement while leases last, with the choice of
//!   which leases ([`Needs`]) stated by the caller.
//! * [`Completer::complete`]: the metrics and the record together, for a batch of claimed rows
//!   (polling). The CDC source records through the same parts; what is its own is where its
//!   stream may confirm, and when a held aggregate goes back to the stream.

use std::{collections::HashMap, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::{
    db::within,
    dispatch::{Item, Outcome},
    health::Health,
    lease::Leases,
    publisher::FailureClass,
    publisher::PublishError,
    retry::{jittered, Backoff, RetryPolicy},
    store::{Failure, Fence, Marking, Store},
    telemetry::{DestinationLabel, FailureLabels, Metrics},
};

/// One reading of both clocks, to turn the monotonic instant of an ack into wall-clock time
/// (one reading per batch instead of one per event).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    mono: Instant,
    wall: DateTime<Utc>,
}

impl Clock {
    /// Both clocks, now.
    pub(crate) fn now() -> Self {
        Self {
            mono: Instant::now(),
            wall: Utc::now(),
        }
    }

    fn wall_at(&self, at: Instant) -> DateTime<Utc> {
        self.wall
            - chrono::Duration::from_std(self.mono.saturating_duration_since(at))
                .unwrap_or_default()
    }
}

/// What became of a batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Events the broker acknowledged.
    pub(crate) published: usize,
    /// Events dead-lettered.
    pub(crate) dead: usize,
    /// Transient failures.
    pub(crate) transient: usize,
}

/// A row whose publish failed, as [`Completer::judge_row`] needs it.
pub(crate) struct FailedRow<'a> {
    pub(crate) id: i64,
    pub(crate) attempts: i32,
    pub(crate) permanent_failures: i32,
    pub(crate) destination: &'a str,
    pub(crate) key: (&'a str, &'a str),
}

/// Counts outcomes and records them for one relay.
pub(crate) struct Completer {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) relay_id: String,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) health: Arc<Health>,
    pub(crate) leases: Arc<Leases>,
    pub(crate) retry: RetryPolicy,
    /// Whether a dead head parks its aggregate (`on_dead = "park"`).
    pub(crate) park: bool,
    /// Longest wait for one statement's answer.
    pub(crate) answer_within: Duration,
}

impl Completer {
    /// The commit-to-ack latency of an event acknowledged at `at`.
    pub(crate) fn observe_latency(
        &self,
        clock: &Clock,
        occurred_at: Option<DateTime<Utc>>,
        at: Instant,
    ) {
        if let Some(occurred_at) = occurred_at {
            let latency = clock.wall_at(at) - occurred_at;
            self.metrics
                .latency
                .observe(latency.num_microseconds().unwrap_or(0).max(0) as f64 / 1e6);
        }
    }

    /// `n` events acknowledged for `destination`.
    pub(crate) fn count_published(&self, destination: &str, n: u64) {
        self.metrics
            .published
            .get_or_create(&DestinationLabel {
                destination: self.metrics.destination_label(destination),
            })
            .inc_by(n);
    }

    /// One event acknowledged at `at`: its latency and the published counter.
    #[cfg(feature = "postgres")]
    pub(crate) fn observe_published(
        &self,
        clock: &Clock,
        destination: &str,
        occurred_at: Option<DateTime<Utc>>,
        at: Instant,
    ) {
        self.observe_latency(clock, occurred_at, at);
        self.count_published(destination, 1);
    }

    /// One failed attempt, counted by destination and class.
    pub(crate) fn count_failure(&self, destination: &str, error: &PublishError) {
        let class = match error.class {
            FailureClass::Transient => "transient",
            FailureClass::Permanent => "permanent",
        };
        self.metrics
            .failed
            .get_or_create(&FailureLabels {
                destination: self.metrics.destination_label(destination),
                class: class.into(),
            })
            .inc();
    }

    /// What to record for an item that failed with `error` (retry or dead letter, see
    /// `RetryPolicy::failure`), with the failure and a dead letter counted and logged.
    pub(crate) fn judge(&self, item: &Item, error: &PublishError) -> Failure {
        self.judge_row(
            FailedRow {
                id: item.id,
                attempts: item.attempts,
                permanent_failures: item.permanent_failures,
                destination: item.destination(),
                key: item.key(),
            },
            error,
        )
    }

    /// [`Completer::judge`] for a row known by its parts (the CDC table path).
    pub(crate) fn judge_row(&self, row: FailedRow<'_>, error: &PublishError) -> Failure {
        let failure = self
            .retry
            .failure(row.id, row.attempts, row.permanent_failures, error);
        self.count_failure(row.destination, error);
        let attempts = row.attempts.saturating_add(1);
        if failure.dead {
            self.count_dead(row.destination);
            tracing::error!(id = row.id, aggregate_type = %row.key.0,
                aggregate_id = %row.key.1, attempts, %error, "event dead-lettered");
        } else {
            tracing::debug!(id = row.id, attempts, %error, "publish failed; will retry");
        }
        failure
    }

    /// One event dead-lettered for `destination`.
    pub(crate) fn count_dead(&self, destination: &str) {
        self.metrics
            .dead_lettered
            .get_or_create(&DestinationLabel {
                destination: self.metrics.destination_label(destination),
            })
            .inc();
    }

    /// The outcomes of a batch claimed under `fences`: counted, then recorded.
    pub(crate) async fn complete(&self, results: &[(Item, Outcome)], fences: &[Fence]) -> Tally {
        let mut tally = Tally::default();
        let mut published = Vec::new();
        let mut failures = Vec::new();
        // Counted per destination for the whole batch, then added to the metrics once each.
        let mut by_destination: HashMap<&str, u64> = HashMap::new();
        let clock = Clock::now();
        for (item, outcome) in results {
            match outcome {
                Outcome::Published(at) => {
                    published.push(item.id);
                    let occurred_at = item.message.as_ref().ok().map(|m| m.occurred_at);
                    self.observe_latency(&clock, occurred_at, *at);
                    *by_destination.entry(item.destination()).or_insert(0) += 1;
                }
                Outcome::Failed(error) => {
                    if error.is_transient() {
                        tally.transient += 1;
                    }
                    let failure = self.judge(item, error);
                    if failure.dead {
                        tally.dead += 1;
                    }
                    failures.push(failure);
                }
                Outcome::Skipped => {}
            }
        }
        for (destination, n) in by_destination {
            self.count_published(destination, n);
        }
        tally.published = published.len();
        // Lapsed leases need nothing more: the successor publishes the events again.
        let _ = self
            .record(fences, &published, &failures, Marking::Claimed)
            .await;
        tally
    }

    /// Writes outcomes (fenced by `fences`), retrying while the leases last (a claimed batch
    /// while any of them does, streamed events while all do: see [`Needs::of`]); counts the
    /// outcomes the fence refused (the lease went to another relay). When the database refuses
    /// a claimed batch's statement for something in its data (SQLSTATE classes 22, 23, 54: a
    /// retry cannot help; streamed events retry it, see [`Refusals::of`]), the outcomes are
    /// written one at a time, so that one row the database
    /// refuses does not leave the others unrecorded and stall the partition; that row stays
    /// pending (it will be published again) and the refusal is logged and counted. Returns
    /// whether the leases lasted to the end.
    pub(crate) async fn record(
        &self,
        fences: &[Fence],
        published: &[i64],
        failures: &[Failure],
        marking: Marking,
    ) -> Recorded {
        let (published, failures) = match self.write(fences, published, failures, marking).await {
            Ok(()) => return Recorded::Done,
            Err(WriteError::Lapsed) => return Recorded::LeasesLapsed,
            Err(WriteError::Refused {
                error,
                published_recorded,
            }) => {
                // The published marks, when they were written before the failures were
                // refused.
                let published = if published_recorded {
                    &[][..]
                } else {
                    published
                };
                if published.len() + failures.len() <= 1 {
                    let id = published
                        .first()
                        .copied()
                        .or(failures.first().map(|f| f.id));
                    self.refused(&error, id.unwrap_or_default());
                    return Recorded::Done;
                }
                tracing::warn!(%error,
                    "the database refused a batch's outcomes; writing them one by one");
                (published, failures)
            }
        };
        for id in published {
            match self
                .write(fences, std::slice::from_ref(id), &[], marking)
                .await
            {
                Err(WriteError::Refused { error, .. }) => self.refused(&error, *id),
                Err(WriteError::Lapsed) => return Recorded::LeasesLapsed,
                Ok(()) => {}
            }
        }
        for failure in failures {
            match self
                .write(fences, &[], std::slice::from_ref(failure), marking)
                .await
            {
                Err(WriteError::Refused { error, .. }) => self.refused(&error, failure.id),
                Err(WriteError::Lapsed) => return Recorded::LeasesLapsed,
                Ok(()) => {}
            }
        }
        Recorded::Done
    }

    fn refused(&self, error: &sqlx::Error, id: i64) {
        self.metrics.database_errors.inc();
        tracing::error!(%error, id,
            "the database refuses to record this event's outcome: it stays pending");
    }

    /// One write of outcomes, retried (see [`Completer::fenced`]) while the leases last. The
    /// published marks and the failures are two statements: one that succeeded is not run
    /// again when the other is retried (run again, it would find its rows settled and count
    /// them as lost to another relay).
    async fn write(
        &self,
        fences: &[Fence],
        published: &[i64],
        failures: &[Failure],
        marking: Marking,
    ) -> Result<(), WriteError> {
        let (needs, refusals) = (Needs::of(marking), Refusals::of(marking));
        let marked = if published.is_empty() {
            0
        } else {
            self.fenced(fences, needs, refusals, || {
                within(
                    self.answer_within,
                    self.store
                        .mark_published(&self.relay_id, fences, published, marking),
                )
            })
            .await
            .map_err(|e| e.refused(false))?
            .len()
        };
        let failed = if failures.is_empty() {
            0
        } else {
            self.fenced(fences, needs, refusals, || {
                within(
                    self.answer_within,
                    self.store
                        .mark_failed(&self.relay_id, fences, failures, self.park),
                )
            })
            .await
            .map_err(|e| e.refused(!published.is_empty()))? as usize
        };
        let expected = published.len() + failures.len();
        // A streamed mark also returns rows settled before; fewer than asked means fenced out.
        let recorded = (marked + failed).min(expected);
        if recorded < expected {
            self.metrics.fenced_out.inc_by((expected - recorded) as u64);
            tracing::warn!(
                lost = expected - recorded,
                "outcomes not recorded: partition lease lost to another relay"
            );
        }
        Ok(())
    }

    /// Runs a statement until it succeeds, retrying it with backoff while the leases `fences`
    /// last, as `needs` says; a statement the database refuses for its data is retried only
    /// as `refusals` says. A failed statement is work the relay has and has not done:
    /// readiness counts it as seen (and the loop as turning), so that one failing for ever
    /// reads as stalled once nothing is published for the stall timeout.
    pub(crate) async fn fenced<T, F, Fut>(
        &self,
        fences: &[Fence],
        needs: Needs,
        refusals: Refusals,
        mut f: F,
    ) -> Result<T, GaveUp>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
    {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            self.health.loop_turned();
            let error = match f().await {
                Ok(v) => {
                    self.health.database_ok();
                    return Ok(v);
                }
                Err(error) => error,
            };
            if refusals == Refusals::GiveUp && refused_for_its_data(&error) {
                // Counted by the caller, once it knows what it could not write.
                return Err(GaveUp::Refused(error));
            }
            self.metrics.database_errors.inc();
            self.health.saw_work();
            if !needs.lasts(&self.leases, fences) {
                tracing::warn!(%error, "a statement failed and the leases lapsed");
                return Err(GaveUp::Lapsed);
            }
            let delay = jittered(&mut backoff);
            tracing::warn!(%error, ?delay, "a statement failed; retrying");
            tokio::time::sleep(delay).await;
        }
    }
}

/// Which of the leases a write is fenced by must last for it to be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Needs {
    /// Any of them: the fence takes effect per partition, so a write under the leases left
    /// still records those partitions' rows (a claimed batch spans partitions, each leased on
    /// its own).
    Any,
    /// All of them: a CDC session streams every partition under one set of leases and ends
    /// when it loses one.
    All,
}

impl Needs {
    /// What a mark of `marking` needs: a claimed batch any lease, streamed events all.
    pub(crate) fn of(marking: Marking) -> Self {
        match marking {
            Marking::Claimed => Self::Any,
            Marking::Streamed => Self::All,
        }
    }

    fn lasts(self, leases: &Leases, fences: &[Fence]) -> bool {
        let valid = |(p, e): &Fence| leases.is_valid(*p, *e);
        match self {
            Self::Any => fences.iter().any(valid),
            Self::All => fences.iter().all(valid),
        }
    }
}

/// Whether [`Completer::fenced`] retries a statement the database refuses for its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusals {
    /// Returned to the caller, which writes around it (the same statement fails again).
    GiveUp,
    /// Retried like any failure: for a statement nothing can be written around (the stream's
    /// position must not pass it), so that the stall shows in readiness.
    Retry,
}

impl Refusals {
    /// What a mark of `marking` does with a refusal: a claimed batch writes around it (the
    /// refused row stays pending, claimed again later); streamed events retry it. A streamed
    /// event left pending keeps its aggregate's hold, and the CDC table path would publish it
    /// again at once, round after round, each round counted as progress; retried, the stall
    /// shows in readiness, as any statement that fails for ever.
    pub(crate) fn of(marking: Marking) -> Self {
        match marking {
            Marking::Claimed => Self::GiveUp,
            Marking::Streamed => Self::Retry,
        }
    }
}

/// Why [`Completer::fenced`] gave up.
#[derive(Debug)]
pub(crate) enum GaveUp {
    /// The database refused the statement for its data.
    Refused(sqlx::Error),
    /// The leases lapsed: the successor publishes the unrecorded events again (duplicates,
    /// never losses).
    Lapsed,
}

impl GaveUp {
    fn refused(self, published_recorded: bool) -> WriteError {
        match self {
            Self::Refused(error) => WriteError::Refused {
                error,
                published_recorded,
            },
            Self::Lapsed => WriteError::Lapsed,
        }
    }
}

/// What [`Completer::record`] managed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Recorded {
    /// Every outcome written, fenced out, or refused for its data (logged and counted).
    Done,
    /// The leases lapsed before the outcomes were written.
    LeasesLapsed,
}

/// Why a write of outcomes stopped.
enum WriteError {
    /// The database refused it for its data.
    Refused {
        error: sqlx::Error,
        /// The published marks were written; the failures were refused.
        published_recorded: bool,
    },
    /// The leases lapsed.
    Lapsed,
}

/// Whether the database refused a statement for the data it touches (SQLSTATE classes 22 data
/// exception, 23 integrity constraint, 54 program limit): the same statement fails again.
pub(crate) fn refused_for_its_data(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| {
            ["22", "23", "54"]
                .iter()
                .any(|class| code.starts_with(class))
        })
}

#[cfg(all(test, feature = "sqlite"))]
#[path = "complete_tests.rs"]
mod tests;
