//! The operating system and the operators: starts the relay processes, restarts the ones that
//! died, and while chaos is on, takes the broker and the database down and steps the database
//! clock.

use std::{sync::Arc, time::Duration};

use outbox_relayer::{store::Store, Relay, RelayConfig, RelayHandle};

use crate::{
    cdc::SimCdc,
    node::{SimPublisher, SimStore},
    world::World,
};

/// One relay slot: the process currently running in it, if any.
struct Slot {
    generation: u32,
    node: usize,
    handle: Option<RelayHandle>,
    restart_at: Option<i64>,
}

/// Runs the relay processes of a simulation.
pub struct Supervisor {
    world: Arc<World>,
    config: RelayConfig,
    slots: Vec<Slot>,
}

const TICK_MS: i64 = 50;

impl Supervisor {
    /// Starts `relays` relay processes with `config`.
    pub fn start(world: Arc<World>, config: RelayConfig, relays: usize) -> Self {
        let mut this = Self {
            world,
            config,
            slots: Vec::new(),
        };
        for i in 0..relays {
            this.slots.push(Slot {
                generation: 0,
                node: usize::MAX,
                handle: None,
                restart_at: None,
            });
            this.launch(i);
        }
        this
    }

    fn launch(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.generation += 1;
        let name = format!("relay{i}.{}", slot.generation);
        let node = self.world.add_node(name.clone());
        let store = SimStore::new(self.world.clone(), node, self.config.lease_ttl);
        let publisher = SimPublisher::new(
            self.world.clone(),
            node,
            self.config.lease_ttl,
            self.config.publish_timeout,
        );
        let mut config = self.config.clone();
        config.relay_id = Some(name.clone());
        let cdc = config.mode == outbox_relayer::config::Mode::Cdc;
        let mut relay = Relay::builder(
            Arc::new(store.clone()) as Arc<dyn Store>,
            Arc::new(publisher),
            config,
        );
        if cdc {
            relay = relay.cdc_database(Arc::new(SimCdc::new(
                store,
                self.world.clone(),
                node,
                self.config.lease_ttl,
            )));
        }
        // Over a store already open, building does no I/O: the future is ready at once.
        let relay = futures::executor::block_on(relay.build())
            .expect("the simulation's relay settings are valid");
        slot.node = node;
        slot.handle = Some(relay.spawn());
        slot.restart_at = None;
        let now = self.world.now();
        self.world.lock().trace(now, || format!("START {name}"));
    }

    /// Supervises until virtual time `until` (ms), or until `done` says so.
    pub async fn run_until(&mut self, until: i64, done: impl Fn(&World) -> bool) {
        while self.world.now() < until && !done(&self.world) {
            tokio::select! {
                biased;
                () = self.world.crashed.notified() => {}
                () = self.world.sleep_ms(TICK_MS) => {}
            }
            self.reap();
            self.inject();
        }
    }

    /// Aborts the tasks of dead processes; restarts them after a while.
    fn reap(&mut self) {
        let now = self.world.now();
        for i in 0..self.slots.len() {
            let (alive, delay) = {
                let mut s = self.world.lock();
                let alive = s.nodes[self.slots[i].node].alive;
                (alive, s.between(100, 3000))
            };
            let slot = &mut self.slots[i];
            if let Some(handle) = slot.handle.take() {
                if !alive {
                    handle.abort();
                    slot.restart_at = Some(now + delay);
                } else if handle.is_finished() {
                    let mut s = self.world.lock();
                    let name = s.nodes[slot.node].name.clone();
                    s.violation(now, format!("{name} stopped by itself (a panic)"));
                    s.nodes[slot.node].alive = false;
                    slot.restart_at = Some(now + delay);
                } else {
                    slot.handle = Some(handle);
                }
            }
            if slot.restart_at.is_some_and(|at| at <= now) {
                self.launch(i);
            }
        }
    }

    /// Broker outages, sick aggregates, database restarts and clock steps, at their rates per
    /// second.
    fn inject(&mut self) {
        let now = self.world.now();
        let mut s = self.world.lock();
        let f = s.faults.clone();
        let per_tick = TICK_MS as f64 / 1000.0;
        if now >= s.broker_down_until && s.chance(f.broker_outage * per_tick) {
            let ms = s.between(300, 5000);
            s.broker_down_until = now + ms;
            s.stats.broker_outages += 1;
            s.trace(now, || format!("BROKER DOWN {ms}ms"));
        }
        if s.slot_back_at.is_some_and(|at| now >= at) {
            // Made again whether chaos is on or not, as an operator would.
            s.slot_back_at = None;
            s.db.wal.create_slot();
            let max_id = s.db.next_id - 1;
            s.db.catch_up_max_id = Some(max_id);
            s.trace(now, || {
                format!("SLOT MADE AGAIN (outbox migrate --cdc); catch up to {max_id}")
            });
        }
        // Table mode only: zero-growth and table-less events not yet streamed are lost with
        // the slot, by design (docs/operations.md, CDC). Never while a commit is in the WAL but not yet
        // visible: such a commit through the whole catch-up is a known gap
        // (docs/reliability.md).
        if s.cdc == Some(crate::config::WriteMode::Table)
            && s.db.wal.slot_exists
            && s.chance(f.slot_loss * per_tick)
            && !s.db.rows.values().any(|r| r.committed && !r.visible)
        {
            s.db.wal.lose_slot();
            s.stats.slots_lost += 1;
            let ms = s.between(500, 5000);
            s.slot_back_at = Some(now + ms);
            s.trace(now, || format!("SLOT LOST; made again in {ms}ms"));
        }
        let healthy = s.sick.as_ref().is_none_or(|(_, until, _)| now >= *until);
        if healthy && s.aggregates > 0 && s.chance(f.sick_aggregate * per_tick) {
            let last = s.aggregates as i64 - 1;
            let id = format!("agg{}", s.between(0, last));
            let ms = s.between(2000, 15000);
            // Refusing fast (a 503) or not answering at all (a destination that hangs).
            let hangs = s.chance(0.5);
            s.stats.sick_aggregates += 1;
            if hangs {
                s.stats.hanging_aggregates += 1;
            }
            let how = if hangs { "HANGS" } else { "SICK" };
            s.trace(now, || format!("AGGREGATE {id} {how} {ms}ms"));
            s.sick = Some((id, now + ms, hangs));
        }
        if now >= s.database_down_until && s.chance(f.database_restart * per_tick) {
            let ms = s.between(300, 3000);
            s.database_down_until = now + ms;
            s.stats.database_restarts += 1;
            // Every walsender ends with the server.
            s.db.wal.end_all();
            s.trace(now, || format!("DATABASE RESTART {ms}ms"));
        }
        if s.chance(f.operator * per_tick) {
            operate(&mut s, now);
        }
        if s.chance(f.clock_step * per_tick) {
            let step = s.between(-3000, 3000);
            s.skew_ms += step;
            s.stats.clock_steps += 1;
            s.trace(now, || format!("DATABASE CLOCK STEP {step}ms"));
        }
    }

    /// Restarts every dead process now (chaos is over).
    pub fn revive_all(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i].handle.is_none() {
                self.launch(i);
            }
        }
    }

    /// Shuts every live relay down gracefully; returns the ones that did not stop in time.
    pub async fn shutdown(self, within: Duration) -> Vec<String> {
        let mut stuck = Vec::new();
        for slot in self.slots {
            let Some(handle) = slot.handle else { continue };
            let name = self.world.lock().nodes[slot.node].name.clone();
            match tokio::time::timeout(within, handle.shutdown()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => stuck.push(format!("{name} stopped with an error: {error}")),
                Err(_) => stuck.push(format!("{name} did not shut down within {within:?}")),
            }
        }
        stuck
    }
}

/// An operator replays dead events (one, an aggregate's, a type's, or all) or skips one or an
/// aggregate's, of those a retry can fail again: undecodable content is never replayed, and a
/// skipped event is not replayed, so that the oracle knows what parks.
fn operate(s: &mut crate::world::State, now: i64) {
    use crate::row::Status;
    let candidates: Vec<i64> =
        s.db.rows
            .iter()
            .filter(|(_, r)| {
                r.status == Status::Dead
                    && r.in_table
                    && r.visible
                    && !crate::db_cdc::undecodable(r.content, s.cdc)
                    && !s.skipped.contains(&r.event)
            })
            .map(|(id, _)| *id)
            .collect();
    if candidates.is_empty() {
        return;
    }
    let id = candidates[s.between(0, candidates.len() as i64 - 1) as usize];
    let db_now = now + s.skew_ms;
    if s.chance(0.5) {
        // `dead-letters replay` selects by id, by aggregate, by event type (or error text: a
        // set of dead events across aggregates, some of one) or `--all`.
        let (ids, how): (Vec<i64>, &str) = match s.between(0, 3) {
            0 => (vec![id], "id"),
            1 => {
                let key = s.db.rows[&id].key.clone();
                let ids = candidates
                    .iter()
                    .copied()
                    .filter(|c| s.db.rows[c].key == key)
                    .collect();
                (ids, "aggregate")
            }
            2 => {
                let kind = crate::row::event_type_of(&s.db.rows[&id]);
                let ids = candidates
                    .iter()
                    .copied()
                    .filter(|c| crate::row::event_type_of(&s.db.rows[c]) == kind)
                    .collect();
                (ids, "event type")
            }
            _ => (candidates.clone(), "all"),
        };
        let replayed = s.db.replay(&ids, db_now);
        if replayed > 0 {
            s.stats.replays += replayed as u64;
            s.trace(now, || {
                format!("OPERATOR replay by {how} {ids:?}: {replayed}")
            });
        }
    } else {
        // `dead-letters skip` by id, or by aggregate (each of its dead events, in id order: a
        // skip releases only the event that parks, and the hold then moves on).
        let ids: Vec<i64> = if s.chance(0.5) {
            vec![id]
        } else {
            let key = s.db.rows[&id].key.clone();
            let mut ids: Vec<i64> = candidates
                .iter()
                .copied()
                .filter(|c| s.db.rows[c].key == key)
                .collect();
            ids.sort_unstable();
            ids
        };
        for id in ids {
            if s.db.skip(id, db_now) {
                s.stats.skips += 1;
                let event = s.db.rows[&id].event;
                s.skipped.insert(event);
                s.trace(now, || format!("OPERATOR skip {id} (event {event})"));
            }
        }
    }
}
