//! The table path of the CDC source: events the stream cannot publish right now (a failure,
//! an aggregate already held) are handed to the events table, where they get attempts, holds
//! and dead letters as in polling mode, and are published from the table, in id order, when
//! their hold lapses or an operator releases them. Also the catch-up of rows older than the
//! slot. See [`crate::source::cdc`].

use std::{collections::HashMap, time::Duration};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    context::{End, Key, Streamed},
    db::{SpillHold, SpillRow},
    inflight::key_of,
    resumes::Resumption,
    source::Session,
};

/// Rows of one aggregate a resumption publishes; more are left for the next one.
const RESUME_LIMIT: i64 = 1000;
use crate::{
    complete::{FailedRow, Recorded},
    config::OnDead,
    dispatch::Outcome,
    publisher::PublishError,
    store::{ClaimedRow, Failure, Marking},
};

impl Session {
    /// Hands a failed event to the table path: attempt, error, hold with backoff, or dead
    /// letter (parking its aggregate).
    pub(super) async fn spill_failed(
        &mut self,
        e: Streamed,
        error: &PublishError,
    ) -> Result<(), End> {
        if self.defer_to_commit(&e, Some(error)) {
            return Ok(());
        }
        let mut failure = self.ctx.completer.retry.failure(
            e.row.id,
            e.row.attempts,
            e.row.permanent_failures,
            error,
        );
        if e.row.unreadable.is_some() && !e.in_table {
            // Table-less content that is not a valid event: written into the table, it would
            // read as an ordinary event (its raw bytes as payload) and be published. A retry
            // cannot make it valid: a dead letter at once.
            failure.dead = true;
            failure.permanent = true;
        }
        let (attempts, dead, backoff) = (
            e.row.attempts.saturating_add(1),
            failure.dead,
            failure.backoff,
        );
        let permanent_failures = e
            .row
            .permanent_failures
            .saturating_add(i32::from(failure.permanent));
        let key: Key = (e.row.aggregate_type.clone(), e.row.aggregate_id.clone());
        if dead {
            tracing::error!(event_id = %e.row.event_id, aggregate_type = %key.0,
                aggregate_id = %key.1, attempts, %error, "event dead-lettered");
            self.ctx.completer.count_dead(&self.destination_of(&e.row));
            self.ctx.health.progressed();
        } else {
            tracing::debug!(event_id = %e.row.event_id, attempts, %error, "publish failed; handed to the table path");
        }
        self.ctx.metrics.cdc_spilled.inc();
        let park = self.ctx.config.on_dead == OnDead::Park;
        // Held until the backoff lapses; parked when dead (or due at once with on_dead = skip,
        // so that the later events go on).
        let wait = if dead {
            (!park).then_some(0.0)
        } else {
            Some(backoff.as_secs_f64())
        };
        let hold = SpillHold {
            key: (&key.0, &key.1),
            head: 0,
            wait_seconds: wait,
            since: e.position,
            replace: true,
        };
        let status = if dead { "dead" } else { "pending" };
        let spill_row = SpillRow {
            row: &e.row,
            status,
            attempts,
            permanent_failures,
            error: Some(crate::store::storable_error(&error.to_string())),
            backoff: Some(backoff),
        };
        // Whether the hold is written: with the row written back, or by `mark_failed`.
        let mut recorded = false;
        let mut settled_before = false;
        if e.in_table {
            let (fences, relay_id, store) = (&self.fences, &self.ctx.relay_id, &self.ctx.store);
            let mark = || store.mark_failed(relay_id, fences, std::slice::from_ref(&failure), park);
            let mut marked = 0;
            for tries in 1..=3u64 {
                marked = self.retry_db(mark).await?;
                if marked > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5 * tries)).await;
            }
            if marked == 0 {
                // Not pending: not visible yet (its commit reached the stream first: waited
                // for, however long), or settled before (a transaction streamed again after
                // a restart: published, or dead-lettered and perhaps skipped since; or the
                // answer to our own mark was lost). A settled row is left as it is, and its
                // aggregate, unless held already, is held at it for the backoff, never parked:
                // parking would undo an operator's skip, or park the aggregate behind a
                // published row; the events behind it wait in the table.
                if e.xid != 0 {
                    self.wait_visible(&[i64::from(e.xid)]).await?;
                }
                marked = self.retry_db(mark).await?;
                if marked == 0 {
                    tracing::debug!(
                        id = e.row.id,
                        "failed row no longer pending: settled before"
                    );
                    settled_before = true;
                }
            }
            recorded = marked > 0;
        }
        let mut wait = if settled_before {
            Some(backoff.as_secs_f64())
        } else {
            wait
        };
        // A dead row `mark_failed` recorded is parked by it (or, with on_dead = skip, its
        // aggregate released), in the same statement, as in polling: a second statement could
        // undo an operator's skip made between the two.
        if settled_before {
            self.hold_settled(&key, e.row.id, wait, e.position).await?;
        } else if !recorded {
            // Not a row of the table (zero-growth, table-less): written with its hold in one
            // transaction, so that it is not lost and never pending without a hold.
            let (id, fresh) = self
                .write_rows(std::slice::from_ref(&spill_row), &[hold])
                .await?[0];
            if !fresh {
                // Its row was written before (a transaction streamed again after a restart, or
                // the answer to our own write lost): held at it as a settled row is (above).
                wait = Some(backoff.as_secs_f64());
                self.hold_settled(&key, id, wait, e.position).await?;
            }
        }
        let entry = self.held.entry(key).or_default();
        entry.due = wait.map(|w| Instant::now() + Duration::from_secs_f64(w));
        if e.position != super::StreamPosition::default() {
            entry.since.get_or_insert(e.position);
        }
        Ok(())
    }

    /// Holds `key` at its settled row `head_id` for `wait` unless it is held already (see
    /// `spill_failed`); the holds are read again before the next resume.
    async fn hold_settled(
        &mut self,
        key: &Key,
        head_id: i64,
        wait: Option<f64>,
        position: super::StreamPosition,
    ) -> Result<(), End> {
        self.hold_unless_held(key, head_id, wait, position).await?;
        // A hold that was there stays: the next upkeep reads it before resuming.
        self.holds_loaded_at = None;
        Ok(())
    }

    /// Holds `key` at `head_id` for `wait` unless it has a hold in the table already (one an
    /// operator released meanwhile comes back).
    async fn hold_unless_held(
        &mut self,
        key: &Key,
        head_id: i64,
        wait: Option<f64>,
        position: super::StreamPosition,
    ) -> Result<(), End> {
        let (db, relay_id, fences) = (&self.ctx.db, &self.ctx.relay_id, &self.fences);
        let held: bool = self
            .retry_db(|| {
                db.hold(
                    relay_id,
                    fences,
                    (&key.0, &key.1),
                    head_id,
                    wait,
                    position,
                    false,
                )
            })
            .await?;
        if !held {
            return Err(End::LeaseLost);
        }
        Ok(())
    }

    /// Hands events of held aggregates (in stream order) to the table: rows already there are
    /// waited for until visible, and their aggregates held; the others are written.
    pub(super) async fn spill_behind(&mut self, events: Vec<Streamed>) -> Result<(), End> {
        if events.is_empty() {
            return Ok(());
        }
        if self.chunk.is_some() {
            for e in events {
                self.defer_to_commit(&e, None);
                if let Some(chunk) = self.chunk.as_mut() {
                    chunk.spills.push((e, None));
                }
            }
            return Ok(());
        }
        // The stream sends again what was not confirmed: an event from before the point where
        // its aggregate was first handed to the table path was settled before (published),
        // and is not written behind the hold again.
        let events: Vec<Streamed> = events
            .into_iter()
            .filter(|e| {
                let settled = !e.in_table
                    && self
                        .held
                        .get(&key_of(e))
                        .and_then(|h| h.since)
                        .is_some_and(|since| e.position < since);
                !settled
            })
            .collect();
        if events.is_empty() {
            return Ok(());
        }
        self.ctx.metrics.cdc_spilled.inc_by(events.len() as u64);
        let to_write: Vec<&Streamed> = events.iter().filter(|e| !e.in_table).collect();
        let rows: Vec<SpillRow<'_>> = to_write
            .iter()
            .map(|e| SpillRow {
                row: &e.row,
                status: "pending",
                attempts: e.row.attempts,
                permanent_failures: e.row.permanent_failures,
                error: None,
                backoff: None,
            })
            .collect();
        // Each aggregate keeps (or, released meanwhile by an operator, gets back) a hold, due
        // at once: its rows are never pending without one.
        let mut holds: Vec<SpillHold<'_>> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, e) in to_write.iter().enumerate() {
            let key = (e.row.aggregate_type.as_str(), e.row.aggregate_id.as_str());
            if seen.insert(key) {
                holds.push(SpillHold {
                    key,
                    head: i,
                    wait_seconds: Some(0.0),
                    since: e.position,
                    replace: false,
                });
            }
        }
        if !rows.is_empty() {
            self.write_rows(&rows, &holds).await?;
        }
        // Rows already in the table: the stream passes them (and confirms past them) only once
        // they are visible to queries (a commit waiting for a synchronous standby reaches the
        // stream first) and their aggregate has a hold in the table (an operator may have
        // released it meanwhile), so that after a restart the table path finds them, in order.
        let in_table: Vec<&Streamed> = events.iter().filter(|e| e.in_table).collect();
        let mut xids: Vec<i64> = in_table
            .iter()
            .filter(|e| e.xid != 0)
            .map(|e| i64::from(e.xid))
            .collect();
        xids.sort_unstable();
        xids.dedup();
        self.wait_visible(&xids).await?;
        let mut seen = std::collections::HashSet::new();
        for e in in_table {
            let key = key_of(e);
            if seen.insert(key.clone()) {
                self.hold_unless_held(&key, e.row.id, Some(0.0), e.position)
                    .await?;
            }
        }
        Ok(())
    }

    /// Waits, however long, until the transactions `xids` (32-bit, as the stream gave them)
    /// are visible to queries; while the leases last, and the relay is not stopping.
    async fn wait_visible(&self, xids: &[i64]) -> Result<(), End> {
        if xids.is_empty() {
            return Ok(());
        }
        let mut tries = 0u64;
        loop {
            let db = &self.ctx.db;
            if self.retry_db(|| db.invisible(xids)).await? == 0 {
                return Ok(());
            }
            // Events wait on it: a wait that does not end reads as stalled.
            self.ctx.health.saw_work();
            if !self.lease_ok() {
                return Err(End::LeaseLost);
            }
            tries += 1;
            if tries == 30 {
                // About two seconds.
                tracing::warn!(
                    ?xids,
                    "the stream waits for transactions it carried to become \
                    visible to queries (commits waiting for a synchronous standby?)"
                );
            }
            // Nothing past these transactions was confirmed: a stop here loses nothing.
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return Err(End::Stop),
                () = tokio::time::sleep(Duration::from_millis((5 * tries).min(250))) => {}
            }
        }
    }

    /// While a chunk of an open transaction is processed, an event for the table path waits
    /// for the commit (see `ChunkWork`): its aggregate is held meanwhile, so that its later
    /// events follow it there. Says whether `e` was deferred; a failure is queued here, an
    /// event behind a hold by the caller.
    fn defer_to_commit(&mut self, e: &Streamed, error: Option<&PublishError>) -> bool {
        let Some(chunk) = self.chunk.as_mut() else {
            return false;
        };
        if let Some(error) = error {
            chunk.spills.push((e.clone(), Some(error.clone())));
        }
        let held = self.held.entry(key_of(e)).or_default();
        held.until_commit = true;
        held.due = None;
        true
    }

    /// A chunked transaction's table path, at its commit (its rows' `in_table` now says
    /// whether they stay): failures recorded, held events spilled, in stream order.
    pub(super) async fn spill_at_commit(
        &mut self,
        spills: Vec<(Streamed, Option<PublishError>)>,
    ) -> Result<(), End> {
        self.marks.reap(true).await?;
        for (e, _) in &spills {
            if let Some(h) = self.held.get_mut(&key_of(e)) {
                h.until_commit = false;
            }
        }
        // Events behind holds go in runs (one statement each, not one per event).
        let mut behind = Vec::new();
        for (e, error) in spills {
            match error {
                Some(error) => {
                    self.spill_behind(std::mem::take(&mut behind)).await?;
                    self.spill_failed(e, &error).await?;
                }
                None => behind.push(e),
            }
        }
        self.spill_behind(behind).await
    }

    /// Reads the holds: aggregates held or parked in the table. One no longer there was
    /// released by an operator (replay, skip): due at once.
    pub(super) async fn reload_holds(&mut self) -> Result<(), sqlx::Error> {
        let rows = self.ctx.db.holds().await?;
        self.holds_loaded_at = Some(Instant::now());
        let now = Instant::now();
        let mut in_db: HashMap<Key, (Option<f64>, Option<super::StreamPosition>)> =
            HashMap::with_capacity(rows.len());
        for r in rows {
            in_db.insert(
                (r.aggregate_type, r.aggregate_id),
                (r.wait_seconds, r.since),
            );
        }
        for (key, h) in self.held.iter_mut() {
            if !in_db.contains_key(key)
                && h.due.is_none()
                && !h.until_commit
                && !self.resumptions.busy(key)
            {
                h.due = Some(now);
            }
        }
        for (key, (wait, since)) in in_db {
            // Being published from the table: its resumption says when it is due next.
            let busy = self.resumptions.busy(&key);
            let h = self.held.entry(key).or_default();
            if since.is_some() {
                h.since = since;
            }
            if !h.until_commit && !busy {
                h.due = wait.map(|w| now + Duration::from_secs_f64(w.max(0.0)));
            }
        }
        Ok(())
    }

    /// Publishes held aggregates whose hold lapsed from the table, in id order, and waits for
    /// the outcome (the catch-up, before streaming starts).
    pub(super) async fn resume(&mut self, keys: Vec<Key>) -> Result<(), End> {
        self.start_resume(keys).await?;
        for job in self.resumptions.take_all() {
            self.finish_resume(job).await?;
        }
        Ok(())
    }

    /// Starts publishing held aggregates whose hold lapsed from the table, in id order, in a
    /// task of its own ([`Resumptions`](super::resumes::Resumptions)): the stream goes on
    /// meanwhile, and [`Session::finish_resumed`] records the outcomes.
    pub(super) async fn start_resume(&mut self, keys: Vec<Key>) -> Result<(), End> {
        // Rows the stream published must be marked before the table is read.
        self.marks.reap(true).await?;
        let mut rows: Vec<ClaimedRow> = Vec::new();
        for key in &keys {
            let (db, max) = (&self.ctx.db, self.ctx.max_payload);
            let found: Vec<ClaimedRow> = self
                .retry_db(|| db.pending_of((&key.0, &key.1), RESUME_LIMIT, max))
                .await?;
            rows.extend(found);
        }
        if !rows.is_empty() {
            self.ctx.health.saw_work();
        }
        for key in &keys {
            if let Some(h) = self.held.get_mut(key) {
                h.due = None;
            }
        }
        let events: Vec<Streamed> = rows
            .iter()
            .cloned()
            .map(|row| Streamed {
                seq: row.id as u64,
                row,
                in_table: true,
                xid: 0,
                position: super::StreamPosition::default(),
            })
            .collect();
        let task = self.dispatch_task(events);
        self.resumptions.start(keys, rows, task);
        Ok(())
    }

    /// Records the outcomes of the resumptions whose publishes are done.
    pub(super) async fn finish_resumed(&mut self) -> Result<(), End> {
        for job in self.resumptions.take_done() {
            self.finish_resume(job).await?;
        }
        Ok(())
    }

    /// Records a resumption's outcomes (published rows marked, failures held or
    /// dead-lettered) and gives each of its aggregates back to the stream once nothing of it
    /// is pending in the table.
    async fn finish_resume(&mut self, job: Resumption) -> Result<(), End> {
        let (keys, items, results) = job.outcome().await;
        let results = results.map_err(|e| End::failed("publishing task", e))?;
        let park = self.ctx.config.on_dead == OnDead::Park;
        let mut failures: Vec<Failure> = Vec::new();
        let mut failed_keys: HashMap<Key, Option<Duration>> = HashMap::new();
        {
            let mut published = Vec::new();
            for (e, destination, outcome) in results {
                match outcome {
                    Outcome::Published(at) => {
                        self.observe_published(&e, &destination, at);
                        self.answered(&destination);
                        published.push(e.row.id);
                    }
                    Outcome::Failed(error) => {
                        self.not_answered(&destination, &error);
                        let failure = self.ctx.completer.judge_row(
                            FailedRow {
                                id: e.row.id,
                                attempts: e.row.attempts,
                                permanent_failures: e.row.permanent_failures,
                                destination: &destination,
                                key: (&e.row.aggregate_type, &e.row.aggregate_id),
                            },
                            &error,
                        );
                        // Due after the backoff; parked when dead, unless dead heads do not
                        // park: then its later rows go on at once.
                        let wait = match (failure.dead, park) {
                            (false, _) => Some(failure.backoff),
                            (true, true) => None,
                            (true, false) => Some(Duration::ZERO),
                        };
                        failed_keys.insert(
                            (e.row.aggregate_type.clone(), e.row.aggregate_id.clone()),
                            wait,
                        );
                        failures.push(failure);
                    }
                    Outcome::Skipped => {}
                }
            }
            // Progress is an outcome that ends an event's wait (as in polling): a retry is
            // not, or a destination that never answers would keep the relay ready.
            if !published.is_empty() || failures.iter().any(|f| f.dead) {
                self.ctx.health.progressed();
            }
            // Streamed marking leaves the holds: an aggregate stays with the table path until
            // `unpark` finds nothing of it pending, even across a crash. A write the database
            // refuses is retried (`Refusals::of`): the stall shows in readiness.
            let recorded = self
                .ctx
                .completer
                .record(&self.fences, &published, &failures, Marking::Streamed)
                .await;
            if recorded == Recorded::LeasesLapsed {
                return Err(End::LeaseLost);
            }
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
            if h.until_commit {
                // An open transaction's chunk handed events of it to the table path while it
                // was published from there: they are written at that commit, behind its hold,
                // which stays (the holds are read again after the commit).
                continue;
            }
            if let Some(wait) = failed_keys.get(&key) {
                h.due = wait.map(|w| now + w);
                continue;
            }
            if found >= RESUME_LIMIT {
                h.due = Some(now);
                continue;
            }
            let (db, relay_id, fences) = (&self.ctx.db, &self.ctx.relay_id, &self.fences);
            let (held, free): (bool, bool) = self
                .retry_db(|| db.unpark(relay_id, fences, (&key.0, &key.1)))
                .await?;
            if !held {
                return Err(End::LeaseLost);
            }
            if free {
                self.held.remove(&key);
            } else if found == 0 {
                // Rows pending, none of them due: its hold in the table says otherwise than
                // this relay's memory (parked or moved by another statement): read the holds
                // before it is resumed again.
                if let Some(h) = self.held.get_mut(&key) {
                    h.due = None;
                }
                self.holds_loaded_at = None;
            } else if let Some(h) = self.held.get_mut(&key) {
                h.due = Some(now);
            }
        }
        Ok(())
    }

    /// A row whose columns cannot be read at all: dead-lettered by id when it has one, its
    /// aggregate parked or let go as `on_dead` says (as any dead letter).
    pub(super) async fn unreadable_row(&mut self, bad: super::BadRow) -> Result<(), End> {
        tracing::error!(id = ?bad.id, reason = %bad.reason, "unreadable outbox row in the stream");
        let Some(id) = bad.id else {
            return Ok(());
        };
        let failure = Failure {
            id,
            error: crate::store::storable_error(&format!(
                "permanent: unreadable row: {}",
                bad.reason
            )),
            backoff: Duration::ZERO,
            dead: true,
            permanent: true,
        };
        let park = self.ctx.config.on_dead == OnDead::Park;
        let (fences, relay_id, store) = (&self.fences, &self.ctx.relay_id, &self.ctx.store);
        let marked = self
            .retry_db(|| store.mark_failed(relay_id, fences, std::slice::from_ref(&failure), park))
            .await?;
        if marked > 0 {
            self.ctx.completer.count_dead("");
            self.ctx.health.progressed();
        }
        self.reload_holds()
            .await
            .map_err(|e| End::failed("loading holds", e))
    }

    /// Dead-letters table rows that cannot be read whole, by id (parking their aggregates
    /// under their real keys, as configured).
    async fn dead_unreadable(&mut self, rows: &[ClaimedRow]) -> Result<(), End> {
        let failures: Vec<Failure> = rows
            .iter()
            .map(|row| {
                let error = PublishError::permanent(row.unreadable.clone().unwrap_or_default());
                self.ctx.completer.judge_row(
                    FailedRow {
                        id: row.id,
                        attempts: row.attempts,
                        permanent_failures: row.permanent_failures,
                        destination: "",
                        key: (&row.aggregate_type, &row.aggregate_id),
                    },
                    &error,
                )
            })
            .collect();
        let park = self.ctx.config.on_dead == OnDead::Park;
        let (fences, relay_id, store) = (&self.fences, &self.ctx.relay_id, &self.ctx.store);
        self.retry_db(|| store.mark_failed(relay_id, fences, &failures, park))
            .await?;
        self.ctx.health.progressed();
        self.reload_holds()
            .await
            .map_err(|e| End::failed("loading holds", e))
    }

    /// Publishes, from the table, the pending rows that may predate the slot.
    pub(super) async fn catch_up(
        &mut self,
        slot: &str,
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        let max_id: Option<i64> = self
            .ctx
            .db
            .catch_up_max_id(slot)
            .await
            .map_err(|e| End::failed("reading the slot record", e))?;
        let Some(max_id) = max_id else {
            return Ok(());
        };
        tracing::info!(
            max_id,
            "catching up: publishing rows that may predate the slot"
        );
        let mut total = 0usize;
        loop {
            self.ctx.health.loop_turned();
            if shutdown.is_cancelled() {
                return Err(End::Stop);
            }
            // A relay that lost its leases stops here, rather than publishing on.
            if !self.lease_ok() {
                return Err(End::LeaseLost);
            }
            let (db, max) = (&self.ctx.db, self.ctx.max_payload);
            let limit = self.ctx.config.max_batch_size;
            let rows: Vec<ClaimedRow> = self.retry_db(|| db.catch_up(max_id, limit, max)).await?;
            if rows.is_empty() {
                break;
            }
            // Rows to publish: a catch-up that reads them again and again without publishing
            // or dead-lettering any reads as stalled.
            self.ctx.health.saw_work();
            total += rows.len();
            // A row the claim columns could not read whole (an aggregate key over 4 KiB reads
            // as a digest, which `pending_of` cannot find it under) is dead-lettered by id
            // here, not through the table path: else it stayed pending and the catch-up read
            // it again for ever.
            let (bad, rows): (Vec<ClaimedRow>, Vec<ClaimedRow>) =
                rows.into_iter().partition(|r| r.unreadable.is_some());
            if !bad.is_empty() {
                self.dead_unreadable(&bad).await?;
            }
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
        let (db, relay_id, fences) = (&self.ctx.db, &self.ctx.relay_id, &self.fences);
        let held: bool = self
            .retry_db(|| db.catch_up_done(relay_id, fences, slot, max_id))
            .await?;
        if !held {
            return Err(End::LeaseLost);
        }
        tracing::info!(rows = total, "caught up");
        Ok(())
    }
}
