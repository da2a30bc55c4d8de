//! The consumer's tables, one statement per `.sql` file beside this one: the inbox (an event
//! is applied or held once per consumer), each aggregate's version state (`consumer_versions`,
//! locked by every transaction that applies or holds an event of it), and the held events
//! (`consumer_held`: messages stored instead of waiting in the broker's in-flight window).
//!
//! Internal: the processor, the drain of held events and the operator tools call these; the
//! tables themselves are created by the outbox migrations.

use std::time::Duration;

use bytes::Bytes;
use sqlx::{PgConnection, Row};

use crate::{Envelope, HandlerError, Message};

/// The statements, rendered once for an outbox schema.
#[derive(Debug)]
pub(crate) struct Statements {
    admit: String,
    admit_locked: String,
    lock_state: String,
    advance: String,
    advance_new: String,
    hold: String,
    count_held: String,
    count_held_new: String,
    pick: String,
    pick_fifo: String,
    pick_lone: String,
    start_try: String,
    untry: String,
    applied: String,
    bury: String,
    buried: String,
    pick_dead: String,
    dropped: String,
    uncount: String,
    forget: String,
    keep_start: String,
    settle: String,
    mark_due: String,
    failed: String,
    later: String,
    wait: String,
    due: String,
    gauges: String,
    purge_inbox: String,
    still_open: String,
    xact: String,
}

impl Statements {
    pub(crate) fn new(tables: &outbox::Tables) -> Self {
        let r = |sql: &str| tables.render(sql);
        Self {
            admit: r(include_str!("sql/admit.sql")),
            admit_locked: r(include_str!("sql/admit_locked.sql")),
            lock_state: r(include_str!("sql/lock_state.sql")),
            advance: r(include_str!("sql/advance.sql")),
            advance_new: r(include_str!("sql/advance_new.sql")),
            hold: r(include_str!("sql/hold.sql")),
            count_held: r(include_str!("sql/count_held.sql")),
            count_held_new: r(include_str!("sql/count_held_new.sql")),
            pick: r(include_str!("sql/pick.sql")),
            pick_fifo: r(include_str!("sql/pick_fifo.sql")),
            pick_lone: r(include_str!("sql/pick_lone.sql")),
            start_try: r(include_str!("sql/start_try.sql")),
            untry: r(include_str!("sql/untry.sql")),
            applied: r(include_str!("sql/applied.sql")),
            bury: r(include_str!("sql/bury.sql")),
            buried: r(include_str!("sql/buried.sql")),
            pick_dead: r(include_str!("sql/pick_dead.sql")),
            dropped: r(include_str!("sql/dropped.sql")),
            uncount: r(include_str!("sql/uncount.sql")),
            forget: r(include_str!("sql/forget.sql")),
            keep_start: r(include_str!("sql/keep_start.sql")),
            settle: r(include_str!("sql/settle.sql")),
            mark_due: r(include_str!("sql/mark_due.sql")),
            failed: r(include_str!("sql/failed.sql")),
            later: r(include_str!("sql/later.sql")),
            wait: r(include_str!("sql/wait.sql")),
            due: r(include_str!("sql/due.sql")),
            gauges: r(include_str!("sql/gauges.sql")),
            purge_inbox: r(include_str!("sql/purge_inbox.sql")),
            still_open: r(include_str!("sql/still_open.sql")),
            xact: r(include_str!("sql/xact.sql")),
        }
    }
}

/// An aggregate: its type and id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Aggregate {
    pub(crate) kind: String,
    pub(crate) id: String,
}

impl Aggregate {
    /// The event's aggregate, when it names one: its id, and its type (empty when it gives
    /// none: a CloudEvent from another producer with a `subject` and no `aggregatetype`). The
    /// runners' lanes follow the same rule.
    pub(crate) fn of(event: &Envelope) -> Option<Self> {
        let id = event.aggregate_id.as_ref()?;
        Some(Self {
            kind: event.aggregate_type.clone().unwrap_or_default(),
            id: id.clone(),
        })
    }
}

/// An aggregate's version state, as its locked row says (all default when it has none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// Whether the row exists.
    pub(crate) known: bool,
    /// The last version applied.
    pub(crate) version: Option<i64>,
    /// The first version this consumer applies (versions below it were never its to apply).
    pub(crate) first_version: Option<i64>,
    /// Whether an operator set the start (`consumer-versions seed`/`skip`).
    pub(crate) seeded: bool,
    /// Events of the aggregate held.
    pub(crate) held: i32,
}

impl State {
    fn of(row: &sqlx::postgres::PgRow, known: bool) -> Result<Self, sqlx::Error> {
        Ok(Self {
            known,
            version: row.try_get("version")?,
            first_version: row.try_get("first_version")?,
            seeded: row.try_get("seeded")?,
            held: row.try_get("held")?,
        })
    }
}

/// A held event, as the drain reads it.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub(crate) id: i64,
    pub(crate) version: Option<i64>,
    pub(crate) message: Message,
    /// Not due yet (it waits for its next attempt).
    pub(crate) later: bool,
    pub(crate) attempts: i32,
    pub(crate) tries: i32,
    pub(crate) last_error: Option<String>,
    /// The aggregate's first hold is older than the settle time asked.
    pub(crate) settled: bool,
}

impl Held {
    fn of(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        let headers: Vec<u8> = row.try_get("headers")?;
        let headers =
            serde_json::from_slice(&headers).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        let payload: Vec<u8> = row.try_get("payload")?;
        let key: Option<Vec<u8>> = row.try_get("record_key")?;
        Ok(Self {
            id: row.try_get("id")?,
            version: row.try_get("version")?,
            message: Message {
                destination: row.try_get("destination")?,
                key: key.map(Bytes::from),
                headers,
                payload: Bytes::from(payload),
            },
            later: row.try_get::<Option<bool>, _>("later")?.unwrap_or(false),
            attempts: row.try_get("attempts")?,
            tries: row.try_get("tries")?,
            last_error: row.try_get("last_error")?,
            settled: row.try_get::<Option<bool>, _>("settled")?.unwrap_or(false),
        })
    }
}

/// The transaction an event's work started in, as PostgreSQL names it: the statements after
/// its handler check that they still run in it.
#[derive(Clone, Debug)]
pub(crate) struct Xact(String);

impl Xact {
    /// From a row of a checking statement (`same`, `status`): whether the transaction is still
    /// open (`true`), or a handler committed it (`false`: logged); an error when a handler
    /// rolled it back.
    fn after(row: &sqlx::postgres::PgRow) -> Result<bool, HandlerError> {
        if row.try_get::<bool, _>("same")? {
            return Ok(true);
        }
        let status: Option<String> = row.try_get("status")?;
        if status.as_deref() == Some("committed") {
            tracing::warn!(
                "a handler committed the consumer's transaction itself: the event's \
                 bookkeeping follows in transactions of its own"
            );
            return Ok(false);
        }
        Err(HandlerError::new(
            "the handler ended the consumer's transaction (ROLLBACK on its connection): \
             the event is not recorded as applied",
        ))
    }
}

/// How a message is to be held.
pub(crate) struct Hold<'a> {
    /// Seconds until it may be tried; `None`: when an earlier event of its aggregate is applied.
    pub(crate) due_in: Option<Duration>,
    /// Failed attempts so far.
    pub(crate) attempts: u32,
    pub(crate) last_error: Option<&'a str>,
    pub(crate) reason: &'a str,
}

/// How a held event leaves (its inbox row stays either way).
#[derive(Clone, Copy)]
pub(crate) enum Leaving {
    /// Applied: the inbox row says when.
    Applied,
    /// Its version was applied already (by another message of it).
    Dropped,
}

/// What a consumer holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Gauges {
    pub(crate) held: i64,
    pub(crate) oldest_seconds: f64,
    pub(crate) waiting: i64,
    /// Given up, their dead letter not stored yet.
    pub(crate) dead: i64,
}

/// Something held and due: an aggregate, an event without one, or a given-up event whose dead
/// letter is still to be stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Due {
    Aggregate(Aggregate),
    Lone(i64),
    Dead(i64),
}

/// The statements bound to one consumer.
#[derive(Clone, Copy)]
pub(crate) struct Store<'a> {
    pub(crate) sql: &'a Statements,
    pub(crate) consumer: &'a str,
}

impl Store<'_> {
    /// Records the event in the inbox and returns whether it is new there, with its
    /// aggregate's state, locked (an event without an aggregate: no state), and the transaction
    /// it runs in (for [`Store::still_open`] and [`Store::advance`] after the handler).
    pub(crate) async fn admit(
        &self,
        conn: &mut PgConnection,
        event: &Envelope,
    ) -> Result<(bool, State, Xact), HandlerError> {
        outbox::check_inbox_message(&event.message_id, Some(&event.event_type))?;
        let aggregate = Aggregate::of(event);
        let lock = aggregate.is_some();
        let sql = if lock {
            &self.sql.admit_locked
        } else {
            &self.sql.admit
        };
        let mut query = sqlx::query(sql)
            .bind(self.consumer)
            .bind(&event.message_id)
            .bind(&event.event_type);
        if let Some(aggregate) = &aggregate {
            query = query.bind(&aggregate.kind).bind(&aggregate.id);
        }
        let row = query.fetch_one(&mut *conn).await?;
        let new: bool = row.try_get("new")?;
        // None for a duplicate, which is rolled back and never checked.
        let xact = Xact(
            row.try_get::<Option<String>, _>("xact")?
                .unwrap_or_default(),
        );
        let state = if lock {
            let known: bool = row.try_get("known")?;
            State::of(&row, known)?
        } else {
            State {
                held: row.try_get("held")?,
                ..State::default()
            }
        };
        Ok((new, state, xact))
    }

    /// The transaction `conn` is in, for [`Store::still_open`] after a handler.
    pub(crate) async fn xact(&self, conn: &mut PgConnection) -> Result<Xact, HandlerError> {
        let xact: String = sqlx::query_scalar(&self.sql.xact)
            .fetch_one(&mut *conn)
            .await?;
        Ok(Xact(xact))
    }

    /// Fails when `xact` can no longer commit after a handler: a statement in it failed (the
    /// handler ignored the error), or the handler rolled it back on its connection. A handler
    /// that committed it passes: its work is committed, and what the caller writes next runs in
    /// transactions of its own ([`Xact::after`]).
    pub(crate) async fn still_open(
        &self,
        conn: &mut PgConnection,
        xact: &Xact,
    ) -> Result<(), HandlerError> {
        let row = sqlx::query(&self.sql.still_open)
            .bind(&xact.0)
            .fetch_one(&mut *conn)
            .await?;
        Xact::after(&row).map(drop)
    }

    /// Locks the aggregate's state row and returns it (`None`: the aggregate has none).
    pub(crate) async fn lock_state(
        &self,
        conn: &mut PgConnection,
        aggregate: &Aggregate,
    ) -> Result<Option<State>, HandlerError> {
        let row = sqlx::query(&self.sql.lock_state)
            .bind(self.consumer)
            .bind(&aggregate.kind)
            .bind(&aggregate.id)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(row.map(|row| State::of(&row, true)).transpose()?)
    }

    /// Records `version` as the aggregate's last applied, in `xact` (an error when a handler
    /// rolled it back; after one that committed it, on its own: see [`Store::still_open`]).
    /// `Ok(false)`: its state row appeared meanwhile (a concurrent first event): try the event
    /// again.
    pub(crate) async fn advance(
        &self,
        conn: &mut PgConnection,
        aggregate: &Aggregate,
        known: bool,
        version: i64,
        xact: &Xact,
    ) -> Result<bool, HandlerError> {
        let sql = if known {
            &self.sql.advance
        } else {
            &self.sql.advance_new
        };
        let mut checked = Some(&xact.0);
        loop {
            let row = sqlx::query(sql)
                .bind(self.consumer)
                .bind(&aggregate.kind)
                .bind(&aggregate.id)
                .bind(version)
                .bind(checked)
                .fetch_one(&mut *conn)
                .await?;
            if Xact::after(&row)? {
                return Ok(row.try_get("done")?);
            }
            // The handler committed the event's work itself: the version follows on its own.
            checked = None;
        }
    }

    /// Holds `message` (decoded as `event`). Counted on its aggregate's state row: `known`
    /// says whether the row exists (and is locked). `Ok(false)`: the row appeared meanwhile
    /// (a concurrent first event): try the event again.
    pub(crate) async fn hold(
        &self,
        conn: &mut PgConnection,
        message: &Message,
        event: &Envelope,
        known: bool,
        hold: Hold<'_>,
    ) -> Result<bool, HandlerError> {
        let aggregate = Aggregate::of(event);
        let inserted: Option<i64> = sqlx::query_scalar(&self.sql.hold)
            .bind(self.consumer)
            .bind(&event.message_id)
            .bind(event.event_id)
            .bind(&event.event_type)
            .bind(aggregate.as_ref().map(|a| a.kind.as_str()))
            .bind(aggregate.as_ref().map(|a| a.id.as_str()))
            .bind(event.aggregate_version)
            .bind(&message.destination)
            // JSON in bytes: a header may hold a NUL, which jsonb and text refuse.
            .bind(serde_json::to_vec(&message.headers).expect("a map of strings serialises"))
            .bind(message.payload.as_ref())
            .bind(message.key.as_deref())
            .bind(hold.due_in.map(|d| d.as_secs_f64()))
            .bind(i32::try_from(hold.attempts).unwrap_or(i32::MAX))
            .bind(hold.last_error)
            .bind(hold.reason)
            .fetch_optional(&mut *conn)
            .await?;
        let (Some(_), Some(aggregate)) = (inserted, aggregate) else {
            return Ok(true);
        };
        let sql = if known {
            &self.sql.count_held
        } else {
            &self.sql.count_held_new
        };
        let done = sqlx::query(sql)
            .bind(self.consumer)
            .bind(&aggregate.kind)
            .bind(&aggregate.id)
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The aggregate's held event to look at next: in version order when `versioned`
    /// (`expected` the version the gate waits for, if it knows one; `settle`, the time a
    /// first-seen aggregate waits for earlier versions), else in arrival order.
    pub(crate) async fn pick(
        &self,
        conn: &mut PgConnection,
        aggregate: &Aggregate,
        versioned: bool,
        expected: Option<i64>,
        settle: Duration,
    ) -> Result<Option<Held>, HandlerError> {
        let query = if versioned {
            sqlx::query(&self.sql.pick)
                .bind(self.consumer)
                .bind(&aggregate.kind)
                .bind(&aggregate.id)
                .bind(expected)
                .bind(settle.as_secs_f64())
        } else {
            sqlx::query(&self.sql.pick_fifo)
                .bind(self.consumer)
                .bind(&aggregate.kind)
                .bind(&aggregate.id)
        };
        let row = query.fetch_optional(&mut *conn).await?;
        Ok(row.map(|row| Held::of(&row)).transpose()?)
    }

    /// A held event without an aggregate, if it is due and no other runner has it (locked).
    pub(crate) async fn pick_lone(
        &self,
        conn: &mut PgConnection,
        id: i64,
    ) -> Result<Option<Held>, HandlerError> {
        let row = sqlx::query(&self.sql.pick_lone)
            .bind(self.consumer)
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(row.map(|row| Held::of(&row)).transpose()?)
    }

    /// Counts a try of held event `id` as started (the caller commits before the try).
    pub(crate) async fn start_try(
        &self,
        conn: &mut PgConnection,
        id: i64,
    ) -> Result<(), HandlerError> {
        sqlx::query(&self.sql.start_try)
            .bind(id)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// A try of held event `id` counted as started did not happen, or met an outage (then it
    /// is put off `outage`).
    pub(crate) async fn untry(
        &self,
        conn: &mut PgConnection,
        id: i64,
        outage: Option<Duration>,
    ) -> Result<(), HandlerError> {
        sqlx::query(&self.sql.untry)
            .bind(id)
            .bind(outage.map(|d| d.as_secs_f64()))
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// Held event `id` leaves (see [`Leaving`]); one event of `aggregate` less held.
    pub(crate) async fn leave(
        &self,
        conn: &mut PgConnection,
        id: i64,
        aggregate: Option<&Aggregate>,
        how: Leaving,
    ) -> Result<(), HandlerError> {
        let sql = match how {
            Leaving::Applied => &self.sql.applied,
            Leaving::Dropped => &self.sql.dropped,
        };
        let deleted: i64 = sqlx::query_scalar(sql)
            .bind(id)
            .fetch_one(&mut *conn)
            .await?;
        // Counted down only for a row this call deleted: two runners letting one event go
        // (a dead letter stored twice) count it once.
        if let (1, Some(aggregate)) = (deleted, aggregate) {
            self.uncount(conn, aggregate).await?;
        }
        Ok(())
    }

    /// One event of `aggregate` less held; its state row goes when it tracks nothing else.
    async fn uncount(
        &self,
        conn: &mut PgConnection,
        aggregate: &Aggregate,
    ) -> Result<(), HandlerError> {
        for sql in [&self.sql.uncount, &self.sql.forget] {
            sqlx::query(sql)
                .bind(self.consumer)
                .bind(&aggregate.kind)
                .bind(&aggregate.id)
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// Gives held event `id` up, to be dead-lettered for `reason` (see `bury.sql`): one event of
    /// `aggregate` less held; an aggregate the gate orders and has not started (`start`, the
    /// event's version) starts no later than it. `Ok(false)`: another runner gave it up first.
    pub(crate) async fn bury(
        &self,
        conn: &mut PgConnection,
        id: i64,
        aggregate: Option<&Aggregate>,
        start: Option<i64>,
        reason: &str,
        grace: Duration,
    ) -> Result<bool, HandlerError> {
        let marked: i64 = sqlx::query_scalar(&self.sql.bury)
            .bind(id)
            .bind(reason)
            .bind(grace.as_secs_f64())
            .fetch_one(&mut *conn)
            .await?;
        if let (1, Some(aggregate)) = (marked, aggregate) {
            if let Some(version) = start {
                self.keep_start(&mut *conn, aggregate, version).await?;
            }
            self.uncount(conn, aggregate).await?;
        }
        Ok(marked == 1)
    }

    /// A given-up event of `aggregate` at `version`: an aggregate the gate has not started
    /// starts no later than it (see `keep_start.sql`).
    pub(crate) async fn keep_start(
        &self,
        conn: &mut PgConnection,
        aggregate: &Aggregate,
        version: i64,
    ) -> Result<(), HandlerError> {
        sqlx::query(&self.sql.keep_start)
            .bind(self.consumer)
            .bind(&aggregate.kind)
            .bind(&aggregate.id)
            .bind(version)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// A given-up event's dead letter is stored: its row goes.
    pub(crate) async fn buried(&self, pool: &sqlx::PgPool, id: i64) -> Result<(), HandlerError> {
        sqlx::query(&self.sql.buried).bind(id).execute(pool).await?;
        Ok(())
    }

    /// Claims a given-up event whose dead letter is due to be stored, for `grace` (no other
    /// sweep takes it meanwhile): the event, and its reason in `last_error`.
    pub(crate) async fn claim_dead(
        &self,
        pool: &sqlx::PgPool,
        id: i64,
        grace: Duration,
    ) -> Result<Option<Held>, HandlerError> {
        let row = sqlx::query(&self.sql.pick_dead)
            .bind(self.consumer)
            .bind(id)
            .bind(grace.as_secs_f64())
            .fetch_optional(pool)
            .await?;
        Ok(row.map(|row| Held::of(&row)).transpose()?)
    }

    /// Makes held event `id` due now, if it was waiting.
    pub(crate) async fn mark_due(
        &self,
        conn: &mut PgConnection,
        id: i64,
    ) -> Result<(), HandlerError> {
        sqlx::query(&self.sql.mark_due)
            .bind(id)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// A try of held event `id` failed with `error`: counted, tried again after `backoff`.
    /// Returns its failed attempts.
    pub(crate) async fn failed(
        &self,
        conn: &mut PgConnection,
        id: i64,
        error: &str,
        backoff: Duration,
        reason: &str,
    ) -> Result<u32, HandlerError> {
        let attempts: Option<i32> = sqlx::query_scalar(&self.sql.failed)
            .bind(id)
            .bind(error)
            .bind(backoff.as_secs_f64())
            .bind(reason)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(attempts.unwrap_or(0).max(0) as u32)
    }

    /// Given-up event `id`'s dead letter is tried again after `delay`; `error` says what
    /// failed.
    pub(crate) async fn later(
        &self,
        pool: &sqlx::PgPool,
        id: i64,
        delay: Duration,
        error: &str,
    ) -> Result<(), HandlerError> {
        sqlx::query(&self.sql.later)
            .bind(id)
            .bind(delay.as_secs_f64())
            .bind(error)
            .execute(pool)
            .await?;
        Ok(())
    }

    /// A settling first-seen aggregate's due events wait until `settle` after its first hold.
    pub(crate) async fn settle(
        &self,
        conn: &mut PgConnection,
        aggregate: &Aggregate,
        settle: Duration,
    ) -> Result<(), HandlerError> {
        sqlx::query(&self.sql.settle)
            .bind(self.consumer)
            .bind(&aggregate.kind)
            .bind(&aggregate.id)
            .bind(settle.as_secs_f64())
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// The aggregate's held events wait for an earlier one: none is due until it comes.
    pub(crate) async fn wait(
        &self,
        conn: &mut PgConnection,
        aggregate: &Aggregate,
        reason: &str,
    ) -> Result<(), HandlerError> {
        sqlx::query(&self.sql.wait)
            .bind(self.consumer)
            .bind(&aggregate.kind)
            .bind(&aggregate.id)
            .bind(reason)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// What is due now, the longest due first, at most `limit`.
    pub(crate) async fn due(
        &self,
        pool: &sqlx::PgPool,
        limit: i64,
    ) -> Result<Vec<Due>, HandlerError> {
        let rows = sqlx::query(&self.sql.due)
            .bind(self.consumer)
            .bind(limit)
            .fetch_all(pool)
            .await?;
        rows.iter()
            .map(|row| {
                let lone: Option<i64> = row.try_get("lone")?;
                let dead: bool = row.try_get("dead")?;
                Ok(match lone {
                    Some(id) if dead => Due::Dead(id),
                    Some(id) => Due::Lone(id),
                    None => Due::Aggregate(Aggregate {
                        kind: row
                            .try_get::<Option<String>, _>("aggregate_type")?
                            .unwrap_or_default(),
                        id: row
                            .try_get::<Option<String>, _>("aggregate_id")?
                            .unwrap_or_default(),
                    }),
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(HandlerError::from)
    }

    /// What the consumer holds now.
    pub(crate) async fn gauges(&self, pool: &sqlx::PgPool) -> Result<Gauges, HandlerError> {
        let row = sqlx::query(&self.sql.gauges)
            .bind(self.consumer)
            .fetch_one(pool)
            .await?;
        Ok(Gauges {
            held: row.try_get("held")?,
            oldest_seconds: row.try_get("oldest_seconds")?,
            waiting: row.try_get("waiting")?,
            dead: row.try_get("dead")?,
        })
    }

    /// Deletes up to `batch` of this consumer's inbox rows older than `retention` (never those
    /// of held events); how many.
    pub(crate) async fn purge_inbox(
        &self,
        pool: &sqlx::PgPool,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, HandlerError> {
        let done = sqlx::query(&self.sql.purge_inbox)
            .bind(self.consumer)
            .bind(retention.as_secs_f64())
            .bind(batch)
            .execute(pool)
            .await?;
        Ok(done.rows_affected())
    }
}
