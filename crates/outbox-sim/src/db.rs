//! The in-memory database: the outbox, lease, relay and hold tables, with the semantics of the
//! relay's SQL (`crates/outbox-relayer/src/postgres/sql/*.sql`) statement for statement. Each method
//! is one statement, applied atomically at one instant of the database clock, as PostgreSQL
//! applies a statement against one snapshot (and the `FOR SHARE` fence makes a takeover wait).
//!
//! Transactional visibility: a writer's rows exist from their INSERT (their ids are taken from
//! the sequence then) but no statement of the relay sees them until the transaction commits;
//! a rollback removes them. Ids are therefore assigned in insert order and become visible in
//! commit order, which is what makes late commits dangerous for a relay.

use std::collections::{BTreeMap, BTreeSet};

use outbox_relayer::store::{Claimed, Failure, Fence, Marking};

use crate::{
    config::Bug,
    row::{claimed, partition_of, Content, Key, Row, Status},
};

#[derive(Clone, Debug, Default)]
struct Lease {
    owner: Option<String>,
    epoch: i64,
    expires_at: i64,
}

#[derive(Clone, Debug)]
pub(crate) struct Hold {
    pub(crate) event_id: i64,
    pub(crate) held_until: Option<i64>,
    /// `stream_commit_lsn`, `stream_change_lsn`: set by the CDC relay's `hold` only.
    pub(crate) since: Option<outbox_relayer::cdc::StreamPosition>,
}

/// The tables.
#[derive(Debug)]
pub struct Db {
    pub(crate) partitions: i32,
    pub(crate) next_id: i64,
    /// Every row inserted and not rolled back, by id.
    pub rows: BTreeMap<i64, Row>,
    leases: Vec<Lease>,
    relays: BTreeMap<String, i64>,
    pub(crate) holds: BTreeMap<Key, Hold>,
    bug: Option<Bug>,
    /// Highest id each partition's claims returned (for the high-water-mark mutation only).
    high_water: BTreeMap<i32, i64>,
    /// The write-ahead log and the replication slot (CDC).
    pub wal: crate::wal::Wal,
    /// Rows the CDC relay wrote for events without one, by event.
    pub copies: BTreeMap<i64, i64>,
    /// Events whose event id is not derived from their id (hostile table-less content).
    pub uuids: BTreeMap<uuid::Uuid, i64>,
    /// `cdc_slots.catch_up_max_id`.
    pub catch_up_max_id: Option<i64>,
}

impl Db {
    /// Empty tables with `partitions` lease rows.
    pub fn new(partitions: i32, bug: Option<Bug>) -> Self {
        Self {
            partitions,
            next_id: 1,
            rows: BTreeMap::new(),
            leases: vec![
                Lease {
                    expires_at: i64::MIN,
                    ..Lease::default()
                };
                partitions as usize
            ],
            relays: BTreeMap::new(),
            holds: BTreeMap::new(),
            bug,
            high_water: BTreeMap::new(),
            wal: crate::wal::Wal::default(),
            copies: BTreeMap::new(),
            uuids: BTreeMap::new(),
            catch_up_max_id: None,
        }
    }

    /// The event a message's event id names, if it is one of the writers'.
    pub fn event_of(&self, event_id: uuid::Uuid) -> Option<i64> {
        let id = self
            .uuids
            .get(&event_id)
            .copied()
            .unwrap_or(event_id.as_u128() as i64);
        self.rows.get(&id).filter(|r| r.event == id).map(|_| id)
    }

    /// Where an event ended: its row's status; for an event without a row, that of the row the
    /// relay wrote for it, or published once the broker has it.
    pub fn outcome(&self, id: i64, delivered: &BTreeSet<i64>) -> Status {
        let row = &self.rows[&id];
        if row.in_table {
            return row.status;
        }
        match self.copies.get(&id) {
            Some(copy) => self.rows[copy].status,
            None if delivered.contains(&id) => Status::Published,
            None => Status::Pending,
        }
    }

    /// Partition count.
    pub fn partitions(&self) -> i32 {
        self.partitions
    }

    /// A writer's INSERT: takes the next id, invisible until [`Db::commit`].
    pub fn insert(
        &mut self,
        key: Key,
        version: i64,
        content: Content,
        payload: Vec<u8>,
        now: i64,
    ) -> i64 {
        self.insert_row(key, version, content, payload, now, true)
    }

    /// An INSERT; `in_table` false for an event written without a row.
    pub fn insert_row(
        &mut self,
        key: Key,
        version: i64,
        content: Content,
        payload: Vec<u8>,
        now: i64,
        in_table: bool,
    ) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        let partition = partition_of(&key, self.partitions);
        self.rows.insert(
            id,
            Row {
                key,
                version,
                partition,
                content,
                payload,
                committed: false,
                visible: false,
                in_table,
                event: id,
                xid: None,
                status: Status::Pending,
                attempts: 0,
                permanent_failures: 0,
                occurred_at: now,
                committed_at: None,
            },
        );
        id
    }

    /// Makes a transaction's rows visible.
    pub fn commit(&mut self, ids: &[i64], now: i64) {
        for id in ids {
            let row = self.rows.get_mut(id).expect("inserted");
            row.committed = true;
            row.visible = true;
            row.committed_at = Some(now);
        }
    }

    /// Removes a transaction's rows.
    pub fn rollback(&mut self, ids: &[i64]) {
        for id in ids {
            self.rows.remove(id);
        }
    }

    /// Whether a statement of the relay can see the row.
    pub(crate) fn visible(&self, row: &Row) -> bool {
        row.in_table && (row.visible || self.bug == Some(Bug::ReadUncommitted))
    }

    /// `register`, `forget_dead_relays`, `live_relays`.
    pub fn heartbeat(&mut self, relay_id: &str, ttl_ms: i64, now: i64) -> Vec<String> {
        self.relays.insert(relay_id.to_owned(), now);
        self.relays.retain(|_, at| *at >= now - ttl_ms * 10);
        self.relays
            .iter()
            .filter(|(_, at)| **at > now - ttl_ms)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// `deregister`.
    pub fn deregister(&mut self, relay_id: &str) {
        self.relays.remove(relay_id);
    }

    /// `renew`: extends the leases still held at their epoch (expired or not, as in SQL).
    pub fn renew(&mut self, relay_id: &str, held: &[Fence], ttl_ms: i64, now: i64) -> Vec<i32> {
        let mut out = Vec::new();
        for &(p, epoch) in held {
            let Some(lease) = self.leases.get_mut(p as usize) else {
                continue;
            };
            if lease.epoch == epoch && lease.owner.as_deref() == Some(relay_id) {
                lease.expires_at = now + ttl_ms;
                out.push(p);
            }
        }
        out
    }

    /// `acquire`: up to `n` free or expired partitions, lowest first, epoch bumped.
    pub fn acquire(&mut self, relay_id: &str, n: i64, ttl_ms: i64, now: i64) -> Vec<Fence> {
        let mut out = Vec::new();
        for (p, lease) in self.leases.iter_mut().enumerate() {
            if out.len() as i64 >= n {
                break;
            }
            if lease.owner.is_none() || lease.expires_at < now {
                lease.owner = Some(relay_id.to_owned());
                lease.epoch += 1;
                lease.expires_at = now + ttl_ms;
                out.push((p as i32, lease.epoch));
            }
        }
        out
    }

    /// `acquire_all`: every partition at once, epochs bumped, when no other relay holds an
    /// unexpired lease; none otherwise.
    pub fn acquire_all(&mut self, relay_id: &str, ttl_ms: i64, now: i64) -> Vec<Fence> {
        let taken = self
            .leases
            .iter()
            .any(|l| l.owner.as_deref().is_some_and(|o| o != relay_id) && l.expires_at >= now);
        if taken {
            return Vec::new();
        }
        self.leases
            .iter_mut()
            .enumerate()
            .map(|(p, lease)| {
                lease.owner = Some(relay_id.to_owned());
                lease.epoch += 1;
                lease.expires_at = now + ttl_ms;
                (p as i32, lease.epoch)
            })
            .collect()
    }

    /// `release`.
    pub fn release(&mut self, relay_id: &str, leases: &[Fence]) {
        for &(p, epoch) in leases {
            if let Some(lease) = self.leases.get_mut(p as usize) {
                if lease.epoch == epoch && lease.owner.as_deref() == Some(relay_id) {
                    lease.owner = None;
                    lease.expires_at = i64::MIN;
                }
            }
        }
    }

    /// Whether the claim's scan skips row `id` of `key` because of a hold: the hold's head (it
    /// comes through its hold when due) and every later row of the aggregate (they wait until
    /// the head is published). Rows before the head are not held back.
    fn held(&self, key: &Key, id: i64) -> bool {
        if self.bug == Some(Bug::IgnoreHolds) {
            return false;
        }
        self.holds.get(key).is_some_and(|h| h.event_id <= id)
    }

    /// `claim`: pending visible rows of each partition in the order given, from its floor, in id
    /// order, skipping the rows held back by a hold (see [`Db::held`]) and aggregates with a
    /// pending row below the floor; then the held heads whose retry is due (when no earlier
    /// row of their aggregate is pending), each with the pending rows after it; `limit` rows
    /// in all, cut where their bytes pass `byte_budget` (the first row always).
    pub fn claim(
        &mut self,
        partitions: &[(i32, i64)],
        limit: i64,
        max_payload: usize,
        byte_budget: i64,
        now: i64,
    ) -> Claimed {
        let mut out = Vec::new();
        for &(p, floor) in partitions {
            let floor = match self.bug {
                Some(Bug::HighWaterMark) => {
                    floor.max(self.high_water.get(&p).copied().unwrap_or(0) + 1)
                }
                _ => floor,
            };
            // The `_pending_aggregate` probe: aggregates with a pending row below the floor.
            let below: BTreeSet<&Key> = if floor > 0 && self.bug != Some(Bug::UncheckedFloors) {
                self.rows
                    .range(..floor)
                    .map(|(_, r)| r)
                    .filter(|r| r.status == Status::Pending && self.visible(r))
                    .map(|r| &r.key)
                    .collect()
            } else {
                BTreeSet::new()
            };
            for (&id, row) in self.rows.range(floor..) {
                if out.len() as i64 >= limit {
                    break;
                }
                if row.partition == p
                    && row.status == Status::Pending
                    && self.visible(row)
                    && !self.held(&row.key, id)
                    && !below.contains(&row.key)
                {
                    out.push(claimed(id, row, max_payload));
                }
            }
        }
        if self.bug != Some(Bug::IgnoreHolds) {
            for &(p, _) in partitions {
                for (key, hold) in &self.holds {
                    if out.len() as i64 >= limit {
                        break;
                    }
                    let due = hold.held_until.is_some_and(|until| until <= now);
                    let Some(head) = self.rows.get(&hold.event_id) else {
                        continue;
                    };
                    let earlier = self.rows.range(..hold.event_id).any(|(_, r)| {
                        &r.key == key && r.status == Status::Pending && self.visible(r)
                    });
                    if due
                        && head.partition == p
                        && head.status == Status::Pending
                        && self.visible(head)
                        && !earlier
                    {
                        // The head and the pending rows after it, in id order.
                        for (&id, row) in self.rows.range(hold.event_id..) {
                            if out.len() as i64 >= limit {
                                break;
                            }
                            if &row.key == key && row.status == Status::Pending && self.visible(row)
                            {
                                out.push(claimed(id, row, max_payload));
                            }
                        }
                    }
                }
            }
        }
        let found = out.len();
        let mut running = 0;
        out.retain(|row| {
            let keep = running < byte_budget;
            running += row.row_bytes;
            keep
        });
        if self.bug == Some(Bug::HighWaterMark) {
            for row in &out {
                let hw = self.high_water.entry(row.partition).or_insert(0);
                *hw = (*hw).max(row.id);
            }
        }
        Claimed {
            cut: out.len() < found,
            rows: out,
        }
    }

    /// The partitions of `fences` still held by `relay_id` at their epoch.
    pub(crate) fn fence(&self, relay_id: &str, fences: &[Fence]) -> BTreeSet<i32> {
        fences
            .iter()
            .filter(|&&(p, epoch)| {
                self.leases
                    .get(p as usize)
                    .is_some_and(|l| l.epoch == epoch && l.owner.as_deref() == Some(relay_id))
            })
            .map(|&(p, _)| p)
            .collect()
    }

    /// `mark_published`: marks the visible pending rows of fenced partitions. A claimed batch
    /// releases the holds whose head it marks and returns the ids marked; streamed events leave
    /// the holds and also return the visible ids no longer pending.
    pub fn mark_published(
        &mut self,
        relay_id: &str,
        fences: &[Fence],
        ids: &[i64],
        marking: Marking,
    ) -> Vec<i64> {
        let fence = self.fence(relay_id, fences);
        let mut done = Vec::new();
        let mut settled = Vec::new();
        for id in ids {
            let visible = self.rows.get(id).is_some_and(|r| self.visible(r));
            let Some(row) = self.rows.get_mut(id) else {
                continue;
            };
            if !visible {
                continue;
            }
            if row.status != Status::Pending {
                settled.push(*id);
            } else if fence.contains(&row.partition) {
                row.status = Status::Published;
                row.attempts += 1;
                done.push((*id, row.key.clone()));
            }
        }
        match marking {
            Marking::Claimed => {
                for (id, key) in &done {
                    if self.holds.get(key).is_some_and(|h| h.event_id == *id) {
                        self.holds.remove(key);
                    }
                }
                done.into_iter().map(|(id, _)| id).collect()
            }
            Marking::Streamed => done.into_iter().map(|(id, _)| id).chain(settled).collect(),
        }
    }

    /// `mark_failed`; returns how many rows were updated, or the error PostgreSQL raises when
    /// one statement would upsert the same hold twice.
    pub fn mark_failed(
        &mut self,
        relay_id: &str,
        fences: &[Fence],
        failures: &[Failure],
        park: bool,
        now: i64,
    ) -> Result<i64, String> {
        let fence = self.fence(relay_id, fences);
        let mut done: Vec<(i64, Key, Status, Option<i64>)> = Vec::new();
        for f in failures {
            let Some(row) = self.rows.get(&f.id) else {
                continue;
            };
            if self.visible(row) && fence.contains(&row.partition) && row.status == Status::Pending
            {
                let next = (!f.dead).then(|| now + f.backoff.as_millis() as i64);
                debug_assert!(f.permanent || !f.dead, "only permanent failures are dead");
                let status = if f.dead {
                    Status::Dead
                } else {
                    Status::Pending
                };
                done.push((f.id, row.key.clone(), status, next));
            }
        }
        let permanent: BTreeSet<i64> = failures
            .iter()
            .filter(|f| f.permanent)
            .map(|f| f.id)
            .collect();
        let mut upserted = BTreeSet::new();
        for (_, key, status, _) in &done {
            if (*status == Status::Pending || park) && !upserted.insert(key.clone()) {
                return Err(
                    "ON CONFLICT DO UPDATE command cannot affect row a second time".to_owned(),
                );
            }
        }
        for (id, key, status, next) in &done {
            let row = self.rows.get_mut(id).expect("found above");
            row.attempts += 1;
            row.permanent_failures += i32::from(permanent.contains(id));
            row.status = *status;
            // A park on another dead event stays (mark_failed.sql).
            let parked = self.holds.get(key).is_some_and(|h| {
                h.held_until.is_none()
                    && h.event_id != *id
                    && self
                        .rows
                        .get(&h.event_id)
                        .is_some_and(|r| r.status == Status::Dead)
            });
            if parked {
                continue;
            }
            if *status == Status::Pending || park {
                self.upsert_hold(key, *id, *next);
            } else {
                self.holds.remove(key);
            }
        }
        Ok(done.len() as i64)
    }

    /// An `INSERT … ON CONFLICT DO UPDATE` of a hold that sets its head and time and keeps
    /// its stream position.
    pub(crate) fn upsert_hold(&mut self, key: &Key, event_id: i64, held_until: Option<i64>) {
        let since = self.holds.get(key).and_then(|h| h.since);
        self.holds.insert(
            key.clone(),
            Hold {
                event_id,
                held_until,
                since,
            },
        );
    }

    /// `backlog`: pending count, oldest pending insert time, dead count.
    pub fn backlog(&self) -> (i64, Option<i64>, i64) {
        let mut pending = 0;
        let mut oldest: Option<i64> = None;
        let mut dead = 0;
        for row in self.rows.values().filter(|r| r.visible && r.in_table) {
            match row.status {
                Status::Pending => {
                    pending += 1;
                    oldest = Some(oldest.map_or(row.occurred_at, |o| o.min(row.occurred_at)));
                }
                Status::Dead => dead += 1,
                Status::Published => {}
            }
        }
        (pending, oldest, dead)
    }
}
