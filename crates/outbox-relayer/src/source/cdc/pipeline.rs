//! Batches in flight: the stream goes on receiving while earlier batches are published, as the
//! polling relay keeps `max_inflight_batches` claims in flight. A batch is handed to the
//! dispatcher, in a task of its own, while fewer than `max_inflight_batches` are in flight and
//! it shares no aggregate with any of them; otherwise the oldest are finished first, so two
//! batches never publish events of one aggregate at once (its order holds). Batches are
//! finished in stream order: outcomes counted, failures handed to the table, published rows
//! marked, then the batch's end position confirmed, never before an earlier batch's.

use std::{collections::HashSet, time::Duration};

use pgwire_replication::Lsn;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    context::{End, Key, Streamed},
    inflight::{key_hash, key_of, Batch, Results},
    source::Session,
};
use crate::{
    dispatch::{self, Item, Outcome},
    publisher::PublishError,
    retry::{jittered, Backoff},
};

/// Rounds in which a batch's transiently failed events are published again in place (a blip
/// of the broker) before they go to the table path with a backoff.
const IN_PLACE_ROUNDS: u32 = 3;
/// First and longest pause between those rounds.
const IN_PLACE_FIRST_DELAY: Duration = Duration::from_millis(50);
const IN_PLACE_MAX_DELAY: Duration = Duration::from_millis(400);

impl Session {
    /// Publishes a batch of streamed events (in stream order), confirming `end` once it and
    /// every earlier batch are settled. Events of held aggregates go to the table first.
    pub(super) async fn publish(
        &mut self,
        events: Vec<Streamed>,
        end: Option<Lsn>,
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        self.ctx.metrics.batch_size.observe(events.len() as f64);
        self.ctx.health.saw_work();
        // Earlier batches with an aggregate of this one finish first: their failures may hold
        // it, which decides below whether its events go to the table.
        let keys: HashSet<u64> = events.iter().map(key_hash).collect();
        let max = self.ctx.config.max_inflight_batches;
        while !self.inflight.is_empty()
            && (self.inflight.queue.len() >= max || self.inflight.overlaps(&keys))
        {
            self.finish_front(shutdown).await?;
        }
        let (behind, todo) = self.divert(events);
        let keys = match behind.is_empty() {
            true => keys,
            false => todo.iter().map(key_hash).collect(),
        };
        if !behind.is_empty() {
            // Into the table behind what is already there. No batch in flight has their
            // aggregates (above); the marks of those published before are written first, so
            // the table path does not publish them again.
            self.marks.reap(true).await?;
            self.spill_behind(behind).await?;
        }
        if todo.is_empty() {
            if let Some(lsn) = end {
                self.confirm_after(lsn);
            }
            return Ok(());
        }
        let task = self.dispatch_task(todo);
        self.inflight.queue.push_back(Batch {
            task,
            done: None,
            keys,
            end,
        });
        Ok(())
    }

    /// Splits a batch (in stream order) into the events that go to the table path, behind
    /// their aggregate's hold, and those to publish. An aggregate's events go to the table
    /// when it is held, or when any of them is routed to a destination that gave no answer
    /// last time (the stream does not wait on it again): then all of them, from its first in
    /// the batch, so that none of it is in flight while it is published from the table, and
    /// its hold's starting point is that first event (the stream sends again, after a
    /// restart, only what came before it, which was settled). Such an aggregate is held, due
    /// at once, and published from the table beside the stream.
    fn divert(&mut self, events: Vec<Streamed>) -> (Vec<Streamed>, Vec<Streamed>) {
        if self.held.is_empty() && self.unanswered.is_empty() {
            return (Vec::new(), events);
        }
        // The aggregates with an event for a destination that does not answer.
        let mut diverted: HashSet<Key> = HashSet::new();
        if !self.unanswered.is_empty() {
            for e in &events {
                if self.unanswered.contains(&self.destination_of(&e.row)) {
                    diverted.insert(key_of(e));
                }
            }
        }
        let mut behind = Vec::new();
        let mut todo = Vec::with_capacity(events.len());
        for e in events {
            let key = key_of(&e);
            if self.held.contains_key(&key) {
                behind.push(e);
            } else if diverted.contains(&key) {
                let h = self.held.entry(key).or_default();
                h.due = Some(tokio::time::Instant::now());
                h.since = Some(e.position);
                behind.push(e);
            } else {
                todo.push(e);
            }
        }
        (behind, todo)
    }

    /// An event for `destination` was acknowledged: the stream publishes its events again.
    pub(super) fn answered(&mut self, destination: &str) {
        if !self.unanswered.is_empty() && self.unanswered.remove(destination) {
            tracing::info!(
                destination,
                "the destination answers again: streaming its events"
            );
        }
    }

    /// An event for `destination` failed with `error`: when it got no answer in time, the
    /// stream hands the destination's events to the table path until it answers again.
    pub(super) fn not_answered(&mut self, destination: &str, error: &PublishError) {
        if dispatch::lanes::unanswered(error) && self.unanswered.insert(destination.to_owned()) {
            tracing::warn!(destination, %error,
                "the destination does not answer: its events wait in the table until it does");
        }
    }

    /// Confirms `lsn` once every batch in flight and every mark before it are settled.
    pub(super) fn confirm_after(&mut self, lsn: Lsn) {
        match self.inflight.queue.back_mut() {
            Some(batch) => batch.end = Some(lsn),
            None => self.marks.confirm_after(lsn),
        }
    }

    /// Finishes the batches already published, oldest first.
    pub(super) async fn finish_ready(&mut self, shutdown: &CancellationToken) -> Result<(), End> {
        while self.inflight.front_ready() {
            self.finish_front(shutdown).await?;
        }
        Ok(())
    }

    /// Finishes every batch in flight, oldest first.
    pub(super) async fn finish_all(&mut self, shutdown: &CancellationToken) -> Result<(), End> {
        while !self.inflight.is_empty() {
            self.finish_front(shutdown).await?;
        }
        Ok(())
    }

    async fn finish_front(&mut self, shutdown: &CancellationToken) -> Result<(), End> {
        let Some(batch) = self.inflight.queue.pop_front() else {
            return Ok(());
        };
        let results = match batch.done {
            Some(done) => done,
            None => batch.task.await,
        }
        .map_err(|e| End::failed("publishing task", e))?;
        self.settle(results, shutdown).await?;
        if let Some(lsn) = batch.end {
            self.marks.confirm_after(lsn);
        }
        Ok(())
    }

    /// Counts a batch's outcomes, publishes transiently failed events again in place a few
    /// times (a blip), hands what still fails to the table (attempt, backoff, hold: that
    /// aggregate waits there while every other one streams on, as in polling), marks the
    /// published rows, and pauses the stream when nothing of the batch went out (a broker that
    /// is down is not hammered, as the polling relay pauses its claims).
    async fn settle(
        &mut self,
        mut results: Results,
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        let mut published: Vec<Streamed> = Vec::new();
        let mut in_place = Backoff::new(IN_PLACE_FIRST_DELAY, IN_PLACE_MAX_DELAY);
        let mut rounds = 0;
        let (failed, behind) = loop {
            self.ctx.health.loop_turned();
            let mut round_failed: Vec<(Streamed, PublishError)> = Vec::new();
            let mut round_skipped: Vec<Streamed> = Vec::new();
            for (e, destination, outcome) in results {
                match outcome {
                    Outcome::Published(at) => {
                        self.observe_published(&e, &destination, at);
                        self.answered(&destination);
                        published.push(e);
                    }
                    Outcome::Failed(error) => {
                        self.not_answered(&destination, &error);
                        round_failed.push((e, error));
                    }
                    Outcome::Skipped => round_skipped.push(e),
                }
            }
            // A skipped event is behind a failure of its own aggregate, or its lane stopped
            // because the lease lapsed: then nothing of this batch may be confirmed.
            let failed_keys: HashSet<Key> = round_failed.iter().map(|(e, _)| key_of(e)).collect();
            if round_skipped
                .iter()
                .any(|e| !failed_keys.contains(&key_of(e)))
            {
                return Err(End::LeaseLost);
            }
            if round_failed.is_empty() {
                break (round_failed, round_skipped);
            }
            // Again in place only after failures that came fast: one that got no answer in
            // time would make the stream wait as long again.
            let blip = round_failed
                .iter()
                .all(|(_, e)| e.is_transient() && !dispatch::lanes::unanswered(e));
            if !blip || rounds >= IN_PLACE_ROUNDS {
                break (round_failed, round_skipped);
            }
            rounds += 1;
            for (e, error) in &round_failed {
                self.count_failure(e, error);
            }
            let delay = jittered(&mut in_place);
            tracing::debug!(failed = round_failed.len(), ?delay, error = %round_failed[0].1,
                "publish failed; retrying in place");
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Err(End::Stop),
                () = tokio::time::sleep(delay) => {}
            }
            if !self.lease_ok() {
                return Err(End::LeaseLost);
            }
            let mut todo: Vec<Streamed> = round_failed.into_iter().map(|(e, _)| e).collect();
            todo.extend(round_skipped);
            todo.sort_by_key(|e| e.seq);
            results = self.dispatch(todo).await?;
        };
        if !published.is_empty() {
            self.ctx.health.progressed();
        }
        let ids = published
            .iter()
            .filter(|e| e.in_table)
            .map(|e| (e.row.id, e.xid));
        match self.chunk.as_mut() {
            Some(chunk) => chunk.published.extend(ids),
            None => self.marks.add(ids),
        }
        if failed.is_empty() {
            self.circuit.reset();
            return Ok(());
        }
        // The table path reads pending rows: earlier marks must be written first, or it
        // would publish again what the stream already did.
        self.marks.reap(true).await?;
        // A broker that is down is not hammered; a destination that gave no answer already
        // cost its timeout, and its events now go to the table path.
        let pause =
            published.is_empty() && !failed.iter().all(|(_, e)| dispatch::lanes::unanswered(e));
        let first_error = failed[0].1.to_string();
        for (e, error) in failed {
            self.count_failure(&e, &error);
            self.spill_failed(e, &error).await?;
        }
        let mut behind = behind;
        behind.sort_by_key(|e| e.seq);
        self.spill_behind(behind).await?;
        if pause {
            let delay = jittered(&mut self.circuit);
            tracing::warn!(?delay, error = %first_error,
                "nothing of the batch was published; pausing the stream");
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Err(End::Stop),
                () = tokio::time::sleep(delay) => {}
            }
        } else {
            self.circuit.reset();
        }
        Ok(())
    }

    /// Publishes `events` through the dispatcher and waits for every outcome.
    pub(super) async fn dispatch(&self, events: Vec<Streamed>) -> Result<Results, End> {
        self.dispatch_task(events)
            .await
            .map_err(|e| End::failed("publishing task", e))
    }

    /// Hands `events` to the dispatcher in a task of their own; it yields each with its routed
    /// destination and its outcome.
    pub(super) fn dispatch_task(&self, events: Vec<Streamed>) -> JoinHandle<Results> {
        let epoch_of = |p: i32| self.fences.iter().find(|f| f.0 == p).map_or(-1, |f| f.1);
        let items: Vec<Item> = events
            .iter()
            .map(|e| {
                // Table-less events have partition 0: any held lease fences them.
                // The row stays with the event (the table path may need it): the item gets
                // a copy.
                dispatch::item(
                    e.row.clone(),
                    e.seq as i64,
                    epoch_of(e.row.partition),
                    &self.ctx.config.routing,
                    self.ctx.max_payload,
                )
            })
            .collect();
        let publisher = self.ctx.publisher.clone();
        let leases = self.ctx.leases.clone();
        let lanes = self.ctx.config.lane_concurrency;
        let timeout = self.ctx.config.publish_timeout;
        tokio::spawn(async move {
            // The dispatcher answers in the order it was given: each outcome is its event's.
            events
                .into_iter()
                .zip(dispatch::dispatch(items, publisher, leases, lanes, timeout).await)
                .map(|(event, (item, outcome))| {
                    debug_assert_eq!(item.id, event.seq as i64);
                    (event, item.destination().to_owned(), outcome)
                })
                .collect()
        })
    }
}
