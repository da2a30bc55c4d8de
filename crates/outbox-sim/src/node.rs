//! A relay process's connections: its [`Store`] (to the simulated database) and its
//! [`Publisher`] (to the simulated broker). Every call is a step at which faults strike: the
//! process dies before or after the call takes effect, stops for longer than its lease, the
//! database restarts or loses the answer, the broker is down, loses or delays the ack.

use std::{fmt::Write as _, sync::Arc, time::Duration};

use futures::future::BoxFuture;
use outbox_relayer::{
    store::{Backlog, Claimed, Failure, Fence, Marking, Store},
    Message, PublishError, Publisher,
};
use tokio_util::sync::CancellationToken;

use crate::{
    config::Bug,
    row::Status,
    world::{Delivery, State, World},
};

/// Where a fault strikes within a call.
enum Fault {
    None,
    CrashBefore,
    CrashAfter,
    PauseBefore,
    PauseAfter,
    ReplyLost,
}

/// One relay process's database connection.
#[derive(Clone)]
pub struct SimStore {
    world: Arc<World>,
    node: usize,
    lease_ttl_ms: i64,
}

impl SimStore {
    /// The connection of process `node`.
    pub fn new(world: Arc<World>, node: usize, lease_ttl: Duration) -> Self {
        Self {
            world,
            node,
            lease_ttl_ms: lease_ttl.as_millis() as i64,
        }
    }

    /// Runs one statement: `f` gets the tables, the database clock and the virtual clock.
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut State, i64, i64) -> Result<T, String>,
    ) -> Result<T, sqlx::Error> {
        let w = &self.world;
        w.gate(self.node).await;
        w.latency(0, 2).await;
        let fault = {
            let mut s = w.lock();
            s.stats.store_calls += 1;
            let faults = s.faults.clone();
            if s.chance(faults.crash_before) {
                Fault::CrashBefore
            } else if s.chance(faults.crash_after) {
                Fault::CrashAfter
            } else if s.chance(faults.pause) {
                if s.chance(0.5) {
                    Fault::PauseBefore
                } else {
                    Fault::PauseAfter
                }
            } else if s.chance(faults.reply_lost) {
                Fault::ReplyLost
            } else {
                Fault::None
            }
        };
        match fault {
            Fault::CrashBefore => w.crash(self.node, op).await,
            Fault::PauseBefore => {
                w.pause(self.node, self.lease_ttl_ms, op);
                w.gate(self.node).await;
            }
            _ => {}
        }
        let now = w.now();
        let result = {
            let mut s = w.lock();
            if now < s.database_down_until {
                let name = s.nodes[self.node].name.clone();
                s.trace(now, || format!("{name} {op}: database unavailable"));
                return Err(unavailable("the database is restarting"));
            }
            let db_now = now + s.skew_ms;
            let result = f(&mut s, db_now, now);
            if let Err(error) = &result {
                let what = format!("{op} failed in the database: {error}");
                s.violation(now, what);
            }
            result
        };
        match fault {
            Fault::CrashAfter => w.crash(self.node, op).await,
            Fault::PauseAfter => w.pause(self.node, self.lease_ttl_ms, op),
            Fault::ReplyLost => {
                let mut s = w.lock();
                s.stats.replies_lost += 1;
                let name = s.nodes[self.node].name.clone();
                s.trace(now, || format!("{name} {op}: reply lost"));
                return Err(unavailable("connection reset by peer"));
            }
            _ => {}
        }
        w.latency(0, 2).await;
        w.gate(self.node).await;
        result.map_err(sqlx::Error::Protocol)
    }

    fn name(s: &State, node: usize) -> String {
        s.nodes[node].name.clone()
    }
}

fn unavailable(what: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        what.to_owned(),
    ))
}

fn fences(list: &[Fence]) -> String {
    let mut sorted = list.to_vec();
    sorted.sort_unstable();
    let mut out = String::new();
    for (p, e) in sorted {
        let _ = write!(out, "{p}@{e} ");
    }
    out
}

impl Store for SimStore {
    fn partitions(&self) -> i32 {
        self.world.lock().db.partitions()
    }

    fn heartbeat<'a>(
        &'a self,
        relay_id: &'a str,
        _hostname: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<String>, sqlx::Error>> {
        Box::pin(self.call("heartbeat", move |s, db_now, now| {
            let live = s.db.heartbeat(relay_id, ttl.as_millis() as i64, db_now);
            s.trace(now, || format!("{relay_id} heartbeat live={live:?}"));
            Ok(live)
        }))
    }

    fn deregister<'a>(&'a self, relay_id: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(self.call("deregister", move |s, _db_now, now| {
            s.db.deregister(relay_id);
            s.trace(now, || format!("{relay_id} deregister"));
            Ok(())
        }))
    }

    fn renew<'a>(
        &'a self,
        relay_id: &'a str,
        held: &'a [Fence],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<i32>, sqlx::Error>> {
        Box::pin(self.call("renew", move |s, db_now, now| {
            let kept = s.db.renew(relay_id, held, ttl.as_millis() as i64, db_now);
            s.trace(now, || {
                format!("{relay_id} renew {}-> {kept:?}", fences(held))
            });
            Ok(kept)
        }))
    }

    fn acquire<'a>(
        &'a self,
        relay_id: &'a str,
        n: i64,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Fence>, sqlx::Error>> {
        Box::pin(self.call("acquire", move |s, db_now, now| {
            let got = s.db.acquire(relay_id, n, ttl.as_millis() as i64, db_now);
            s.trace(now, || {
                format!("{relay_id} acquire {n} -> {}", fences(&got))
            });
            Ok(got)
        }))
    }

    fn acquire_all<'a>(
        &'a self,
        relay_id: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Fence>, sqlx::Error>> {
        Box::pin(self.call("acquire_all", move |s, db_now, now| {
            let got = s.db.acquire_all(relay_id, ttl.as_millis() as i64, db_now);
            s.trace(now, || {
                format!("{relay_id} acquire_all -> {}", fences(&got))
            });
            Ok(got)
        }))
    }

    fn release<'a>(
        &'a self,
        relay_id: &'a str,
        leases: &'a [Fence],
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(self.call("release", move |s, _db_now, now| {
            s.db.release(relay_id, leases);
            s.trace(now, || format!("{relay_id} release {}", fences(leases)));
            Ok(())
        }))
    }

    fn claim<'a>(
        &'a self,
        partitions: &'a [(i32, i64)],
        limit: i64,
        max_payload_bytes: usize,
        byte_budget: i64,
    ) -> BoxFuture<'a, Result<Claimed, sqlx::Error>> {
        let node = self.node;
        Box::pin(self.call("claim", move |s, db_now, now| {
            let claimed =
                s.db.claim(partitions, limit, max_payload_bytes, byte_budget, db_now);
            let name = Self::name(s, node);
            s.trace(now, || {
                let ids: Vec<i64> = claimed.rows.iter().map(|r| r.id).collect();
                let cut = if claimed.cut { " (cut)" } else { "" };
                format!("{name} claim {partitions:?} limit {limit} -> {ids:?}{cut}")
            });
            Ok(claimed)
        }))
    }

    fn mark_published<'a>(
        &'a self,
        relay_id: &'a str,
        fences_held: &'a [Fence],
        ids: &'a [i64],
        marking: Marking,
    ) -> BoxFuture<'a, Result<Vec<i64>, sqlx::Error>> {
        Box::pin(self.call("mark_published", move |s, _db_now, now| {
            let settled = s.db.mark_published(relay_id, fences_held, ids, marking);
            for id in &settled {
                let event = s.db.rows[id].event;
                if !s.delivered.contains(&event) {
                    s.violation(
                        now,
                        format!("G3: {relay_id} marked event {event} published; the broker never stored it"),
                    );
                }
            }
            s.trace(now, || {
                let mut sorted = ids.to_vec();
                sorted.sort_unstable();
                format!(
                    "{relay_id} mark_published {marking:?} {}{sorted:?} -> {settled:?}",
                    fences(fences_held),
                )
            });
            Ok(settled)
        }))
    }

    fn mark_failed<'a>(
        &'a self,
        relay_id: &'a str,
        fences_held: &'a [Fence],
        failures: &'a [Failure],
        park_on_dead: bool,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(self.call("mark_failed", move |s, db_now, now| {
            let n =
                s.db.mark_failed(relay_id, fences_held, failures, park_on_dead, db_now)?;
            s.trace(now, || {
                let mut list: Vec<(i64, bool)> = failures.iter().map(|f| (f.id, f.dead)).collect();
                list.sort_unstable();
                format!(
                    "{relay_id} mark_failed {}{list:?} -> {n}",
                    fences(fences_held)
                )
            });
            Ok(n)
        }))
    }

    fn backlog(&self) -> BoxFuture<'_, Result<Backlog, sqlx::Error>> {
        Box::pin(self.call("backlog", move |s, db_now, _now| {
            let (pending, oldest, dead) = s.db.backlog();
            Ok(Backlog {
                pending,
                oldest_age: oldest.map(|o| Duration::from_millis((db_now - o).max(0) as u64)),
                dead,
            })
        }))
    }

    fn notifications(
        &self,
        wake: Arc<tokio::sync::Notify>,
        shutdown: CancellationToken,
    ) -> Option<BoxFuture<'static, ()>> {
        let world = self.world.clone();
        Some(Box::pin(async move {
            loop {
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return,
                    () = world.commits.notified() => wake.notify_one(),
                }
            }
        }))
    }
}

/// One relay process's broker connection.
#[derive(Clone)]
pub struct SimPublisher {
    world: Arc<World>,
    node: usize,
    lease_ttl_ms: i64,
    publish_timeout_ms: i64,
}

impl SimPublisher {
    /// The connection of process `node`.
    pub fn new(world: Arc<World>, node: usize, lease_ttl: Duration, timeout: Duration) -> Self {
        Self {
            world,
            node,
            lease_ttl_ms: lease_ttl.as_millis() as i64,
            publish_timeout_ms: timeout.as_millis() as i64,
        }
    }

    async fn send(&self, m: &Message) -> Result<(), PublishError> {
        let w = &self.world;
        w.gate(self.node).await;
        w.latency(0, 3).await;
        let (crash_before, pause_before, crash_after) = {
            let mut s = w.lock();
            s.stats.publish_calls += 1;
            let faults = s.faults.clone();
            (
                s.chance(faults.crash_before),
                s.chance(faults.pause),
                s.chance(faults.crash_after),
            )
        };
        if crash_before {
            w.crash(self.node, "publish, before the broker got it")
                .await;
        }
        if pause_before {
            w.pause(self.node, self.lease_ttl_ms, "publish, before sending");
            w.gate(self.node).await;
        }
        let now = w.now();
        let ack = {
            let mut s = w.lock();
            let name = s.nodes[self.node].name.clone();
            let faults = s.faults.clone();
            if now < s.broker_down_until {
                s.trace(now, || {
                    format!(
                        "{name} publish {}: broker unavailable",
                        m.event_id.as_u128() as i64
                    )
                });
                Ack::Refused
            } else if let Some((_, _, hangs)) = s
                .sick
                .clone()
                .filter(|(id, until, _)| now < *until && *id == m.aggregate_id)
            {
                s.trace(now, || {
                    format!(
                        "{name} publish {}: its aggregate is sick{}",
                        m.event_id.as_u128() as i64,
                        if hangs { " (no answer)" } else { "" }
                    )
                });
                if hangs {
                    Ack::Hangs
                } else {
                    Ack::Refused
                }
            } else if m.payload.as_ref() == b"poison" {
                s.trace(now, || {
                    format!("{name} publish {}: rejected", m.event_id.as_u128() as i64)
                });
                Ack::Rejected
            } else {
                let stored = !(s.bug == Some(Bug::AckWithoutStoring) && s.chance(0.02));
                if stored {
                    store(&mut s, self.node, m.event_id, now);
                    if s.chance(faults.broker_duplicate) {
                        s.stats.broker_duplicates += 1;
                        store(&mut s, self.node, m.event_id, now);
                    }
                }
                if s.chance(faults.ack_lost) {
                    s.stats.acks_lost += 1;
                    Ack::Lost
                } else if s.chance(faults.ack_delayed) {
                    s.stats.acks_delayed += 1;
                    let timeout = self.publish_timeout_ms;
                    Ack::Delayed(s.between(timeout / 2, timeout * 2))
                } else {
                    Ack::Normal
                }
            }
        };
        match ack {
            Ack::Refused => {
                w.latency(0, 5).await;
                return Err(PublishError::transient("connection refused"));
            }
            Ack::Rejected => {
                w.latency(0, 3).await;
                return Err(PublishError::permanent("rejected by the broker"));
            }
            _ => {}
        }
        if crash_after {
            w.crash(self.node, "after publish, before the ack").await;
        }
        match ack {
            Ack::Lost | Ack::Hangs => std::future::pending::<()>().await,
            Ack::Delayed(ms) => w.sleep_ms(ms).await,
            _ => w.latency(0, 3).await,
        }
        w.gate(self.node).await;
        Ok(())
    }
}

/// What the broker answers.
enum Ack {
    Normal,
    Lost,
    Delayed(i64),
    Refused,
    Rejected,
    /// Never answers, and does not store the message.
    Hangs,
}

/// The broker stores a message: checks that the event exists and is committed (G2).
fn store(s: &mut State, node: usize, event_id: uuid::Uuid, now: i64) {
    let Some(id) = s.db.event_of(event_id) else {
        s.violation(
            now,
            format!("G2: event {event_id}, which no writer wrote, reached the broker"),
        );
        return;
    };
    let committed = s.db.rows.get(&id).is_some_and(|r| r.committed);
    if !committed {
        let what = if s.rolled_back.contains(&id) {
            "rolled back"
        } else {
            "not committed yet"
        };
        s.violation(now, format!("G2: event {id} reached the broker, {what}"));
    }
    if s.db.outcome(id, &s.delivered) == Status::Dead {
        s.violation(
            now,
            format!("event {id} reached the broker after it was dead-lettered"),
        );
    }
    s.deliveries.push(Delivery { id, node, at: now });
    s.delivered.insert(id);
    let name = s.nodes[node].name.clone();
    s.trace(now, || format!("{name} BROKER stored {id}"));
}

impl Publisher for SimPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(self.send(message))
    }

    fn name(&self) -> &'static str {
        "simulated broker"
    }

    fn max_payload_bytes(&self) -> usize {
        1 << 20
    }
}
