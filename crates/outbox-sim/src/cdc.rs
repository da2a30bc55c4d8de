//! A relay process's CDC connections: its statements (the model's, through the same faults as
//! every other statement) and its replication stream. The stream fails where a real one does:
//! the relay dies or stops while reading it, the database restarts under it (the walsender
//! ends), a successor terminates it; and it reports the confirmed position only now and then,
//! so a crash loses the last confirmations (the next stream sends those transactions again).

use std::{sync::Arc, time::Duration};

use futures::future::BoxFuture;
use outbox_relayer::{
    cdc::{
        AggregateKey, CdcDb, HoldRow, Lsn, ReplicationEvent, SlotState, SpillHold, SpillRow,
        Spilled, StreamError, StreamPosition, WalStream,
    },
    store::{ClaimedRow, Fence},
};

use crate::{node::SimStore, world::World};

/// The schema and table the simulated outbox has.
pub const SCHEMA: &str = "outbox";
/// See [`SCHEMA`].
pub const TABLE: &str = "events";

/// One relay process's CDC database.
pub struct SimCdc {
    store: SimStore,
    world: Arc<World>,
    node: usize,
    lease_ttl_ms: i64,
    relay_write_prefix: String,
}

impl SimCdc {
    /// The CDC database of process `node` (its statements go through `store`'s faults).
    pub fn new(store: SimStore, world: Arc<World>, node: usize, lease_ttl: Duration) -> Self {
        let tables = outbox_tables();
        Self {
            store,
            world,
            node,
            lease_ttl_ms: lease_ttl.as_millis() as i64,
            relay_write_prefix: outbox_relayer::cdc::relay_write_prefix(&tables),
        }
    }
}

/// The simulated outbox's tables.
pub fn outbox_tables() -> outbox::Tables {
    outbox::Tables::new(SCHEMA, TABLE).expect("valid names")
}

fn key(k: AggregateKey<'_>) -> (String, String) {
    (k.0.to_owned(), k.1.to_owned())
}

impl CdcDb for SimCdc {
    fn spill<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        rows: &'a [SpillRow<'a>],
        holds: &'a [SpillHold<'a>],
    ) -> BoxFuture<'a, Result<Spilled, sqlx::Error>> {
        let prefix = &self.relay_write_prefix;
        Box::pin(self.store.call("spill", move |s, db_now, now| {
            let spilled =
                s.db.spill(relay_id, fences, rows, holds, prefix, db_now, now)?;
            s.trace(now, || {
                let events: Vec<String> = rows
                    .iter()
                    .map(|r| format!("{}:{}", r.row.event_id.as_u128() as i64, r.status))
                    .collect();
                let held: Vec<_> = holds
                    .iter()
                    .map(|h| (h.key, h.wait_seconds, h.replace))
                    .collect();
                format!("{relay_id} spill {events:?} holds {held:?} -> {spilled:?}")
            });
            Ok(spilled)
        }))
    }

    fn hold<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        k: AggregateKey<'a>,
        head_id: i64,
        wait_seconds: Option<f64>,
        since: StreamPosition,
        replace: bool,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(self.store.call("hold", move |s, db_now, now| {
            let wait_ms = wait_seconds.map(|w| (w * 1000.0) as i64);
            let held = s.db.hold(
                relay_id,
                fences,
                &key(k),
                head_id,
                wait_ms,
                since,
                replace,
                db_now,
            );
            s.trace(now, || {
                format!("{relay_id} hold {k:?} at {head_id} for {wait_ms:?} ms -> {held}")
            });
            Ok(held)
        }))
    }

    fn pending_of<'a>(
        &'a self,
        k: AggregateKey<'a>,
        limit: i64,
        max_payload: usize,
    ) -> BoxFuture<'a, Result<Vec<ClaimedRow>, sqlx::Error>> {
        let node = self.node;
        Box::pin(self.store.call("pending_of", move |s, db_now, now| {
            let rows = s.db.pending_of(&key(k), limit, max_payload, db_now);
            let name = s.nodes[node].name.clone();
            s.trace(now, || {
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                format!("{name} pending_of {k:?} -> {ids:?}")
            });
            Ok(rows)
        }))
    }

    fn catch_up<'a>(
        &'a self,
        max_id: i64,
        limit: i64,
        max_payload: usize,
    ) -> BoxFuture<'a, Result<Vec<ClaimedRow>, sqlx::Error>> {
        let node = self.node;
        Box::pin(self.store.call("catch_up", move |s, _db_now, now| {
            let rows = s.db.catch_up(max_id, limit, max_payload);
            let name = s.nodes[node].name.clone();
            s.trace(now, || {
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                format!("{name} catch_up to {max_id} -> {ids:?}")
            });
            Ok(rows)
        }))
    }

    fn catch_up_max_id<'a>(
        &'a self,
        _slot: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(self.store.call("catch_up_max_id", |s, _db_now, _now| {
            Ok(s.db.catch_up_max_id)
        }))
    }

    fn catch_up_done<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        _slot: &'a str,
        max_id: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(self.store.call("catch_up_done", move |s, _db_now, now| {
            let held = s.db.catch_up_done(relay_id, fences, max_id);
            s.trace(now, || {
                format!("{relay_id} catch_up_done {max_id} -> {held}")
            });
            Ok(held)
        }))
    }

    fn holds(&self) -> BoxFuture<'_, Result<Vec<HoldRow>, sqlx::Error>> {
        Box::pin(
            self.store
                .call("holds", |s, db_now, _now| Ok(s.db.hold_rows(db_now))),
        )
    }

    fn unpark<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        k: AggregateKey<'a>,
    ) -> BoxFuture<'a, Result<(bool, bool), sqlx::Error>> {
        Box::pin(self.store.call("unpark", move |s, _db_now, now| {
            let answer = s.db.unpark(relay_id, fences, &key(k));
            s.trace(now, || format!("{relay_id} unpark {k:?} -> {answer:?}"));
            Ok(answer)
        }))
    }

    fn slot<'a>(&'a self, _slot: &'a str) -> BoxFuture<'a, Result<Option<SlotState>, sqlx::Error>> {
        Box::pin(self.store.call("slot", |s, db_now, _now| {
            let wal = &s.db.wal;
            Ok(wal.slot_exists.then(|| {
                let lag = (wal.end() - wal.confirmed) as i64;
                SlotState {
                    lag_bytes: Some(lag),
                    retained_bytes: Some(lag),
                    elsewhere: None,
                    now: chrono::DateTime::from_timestamp_millis(db_now).unwrap_or_default(),
                }
            }))
        }))
    }

    fn terminate<'a>(
        &'a self,
        relay_id: &'a str,
        fences: &'a [Fence],
        _slot: &'a str,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(self.store.call("terminate", move |s, _db_now, now| {
            let held = s.db.fence(relay_id, fences).len() == fences.len();
            let active = s.db.wal.active;
            if held {
                if let Some(n) = active {
                    s.db.wal.end_stream(n);
                }
            }
            s.trace(now, || {
                format!("{relay_id} terminate stream {active:?} -> {held}")
            });
            Ok(held)
        }))
    }

    fn heartbeat<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(
            self.store
                .call("heartbeat message", move |s, _db_now, _now| {
                    s.db.wal.message(prefix);
                    Ok(())
                }),
        )
    }

    fn invisible<'a>(&'a self, xids: &'a [i64]) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(self.store.call("invisible", move |s, _db_now, _now| {
            Ok(s.db.invisible(xids))
        }))
    }

    fn replicate<'a>(
        &'a self,
        _slot: &'a str,
        _publication: &'a str,
        _application: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn WalStream>, StreamError>> {
        let node = self.node;
        Box::pin(async move {
            let opened = self
                .store
                .call("start replication", move |s, _db_now, now| {
                    let opened = s.db.wal.open(node);
                    let name = s.nodes[node].name.clone();
                    s.trace(now, || format!("{name} start replication -> {opened:?}"));
                    Ok(opened)
                })
                .await?;
            let n = opened.map_err(sqlx::Error::Protocol)?;
            Ok(Box::new(SimStream {
                world: self.world.clone(),
                node,
                n,
                lease_ttl_ms: self.lease_ttl_ms,
                applied: std::sync::atomic::AtomicU64::new(0),
            }) as Box<dyn WalStream>)
        })
    }
}

/// One replication stream of a relay process.
pub struct SimStream {
    world: Arc<World>,
    node: usize,
    n: u64,
    lease_ttl_ms: i64,
    applied: std::sync::atomic::AtomicU64,
}

/// How often an idle stream reports its position (the client's status interval).
const STATUS_INTERVAL_MS: i64 = 200;

impl SimStream {
    async fn next(&mut self) -> Result<Option<ReplicationEvent>, StreamError> {
        let w = self.world.clone();
        loop {
            w.gate(self.node).await;
            let (crash, pause) = {
                let mut s = w.lock();
                let f = s.faults.clone();
                // A step of the stream is smaller than a statement: a tenth of the chance.
                (s.chance(f.crash_before / 10.0), s.chance(f.pause / 10.0))
            };
            if crash {
                w.crash(self.node, "reading the stream").await;
            }
            if pause {
                w.pause(self.node, self.lease_ttl_ms, "reading the stream");
                w.gate(self.node).await;
            }
            let now = w.now();
            {
                let mut s = w.lock();
                if now < s.database_down_until {
                    s.db.wal.end_stream(self.n);
                }
                let applied = self.applied.load(std::sync::atomic::Ordering::SeqCst);
                let on_receipt = s.bug == Some(crate::Bug::ConfirmOnReceipt);
                let Some(stream) = s.db.wal.streams.get_mut(&self.n) else {
                    return Err("the stream is gone".into());
                };
                if stream.ended {
                    return Err("terminating connection due to administrator command".into());
                }
                stream.applied = stream.applied.max(applied);
                if on_receipt {
                    stream.applied = stream.applied.max(stream.sent);
                }
                if s.chance(0.2) {
                    s.db.wal.report(self.n);
                }
                if let Some(event) = s.db.wal.next(self.n, SCHEMA, TABLE) {
                    return Ok(Some(event));
                }
                s.db.wal.report(self.n);
            }
            tokio::select! {
                () = w.commits.notified() => {}
                () = w.sleep_ms(STATUS_INTERVAL_MS) => {
                    let end = w.lock().db.wal.streams.get(&self.n).map_or(0, |st| st.sent);
                    return Ok(Some(ReplicationEvent::KeepAlive {
                        wal_end: Lsn(end),
                        reply_requested: false,
                        server_time_micros: 0,
                    }));
                }
            }
        }
    }
}

impl WalStream for SimStream {
    fn recv(&mut self) -> BoxFuture<'_, Result<Option<ReplicationEvent>, StreamError>> {
        Box::pin(self.next())
    }

    fn update_applied_lsn(&self, lsn: Lsn) {
        self.applied
            .fetch_max(lsn.0, std::sync::atomic::Ordering::SeqCst);
    }

    fn reported_lsn(&self) -> Lsn {
        let s = self.world.lock();
        Lsn(s.db.wal.streams.get(&self.n).map_or(0, |st| st.reported))
    }

    fn shutdown(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut s = self.world.lock();
            let applied = self.applied.load(std::sync::atomic::Ordering::SeqCst);
            if let Some(st) = s.db.wal.streams.get_mut(&self.n) {
                st.applied = st.applied.max(applied);
            }
            s.db.wal.report(self.n);
            s.db.wal.end_stream(self.n);
        })
    }

    fn abort(self: Box<Self>) {
        self.world.lock().db.wal.end_stream(self.n);
    }
}
