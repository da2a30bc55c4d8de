//! The oracle: after a run, checks the broker's log and the tables against the guarantees.
//!
//! * **G1** every committed event reached the broker and is marked published; the exceptions
//!   are events that cannot be published (rejected by the broker, malformed rows), which must be
//!   dead-lettered, and the events after them in their aggregate, which must wait (parked).
//!   A good event is never dead-lettered (transient failures never dead-letter).
//! * **G2** no rolled-back or uncommitted event reached the broker (also checked as it happens).
//! * **G3** nothing was marked published that the broker had not stored (checked at the mark).
//! * **G4** no event reached the broker before the first delivery of every earlier event of its
//!   aggregate. Duplicates are allowed (at least once) and counted.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    db_cdc::undecodable,
    row::{Content, Key, Status},
    world::State,
};

/// What the oracle counted.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Events committed.
    pub committed: u64,
    /// Distinct events the broker holds.
    pub delivered: u64,
    /// Extra copies at the broker.
    pub duplicates: u64,
    /// Events dead-lettered (all of them unpublishable by construction).
    pub dead: u64,
    /// Events waiting behind a dead event of their aggregate.
    pub parked: u64,
    /// Largest commit-to-first-delivery time (virtual ms).
    pub worst_lag_ms: i64,
    /// Violations found.
    pub violations: Vec<String>,
}

/// Checks the final state.
pub fn check(s: &State) -> Verdict {
    let mut v = Verdict::default();
    let mut copies: BTreeMap<i64, u64> = BTreeMap::new();
    let mut first_at: BTreeMap<i64, i64> = BTreeMap::new();
    for d in &s.deliveries {
        *copies.entry(d.id).or_insert(0) += 1;
        first_at.entry(d.id).or_insert(d.at);
    }
    v.delivered = copies.len() as u64;
    v.duplicates = s.deliveries.len() as u64 - v.delivered;
    for id in copies.keys() {
        if s.rolled_back.contains(id) {
            v.violations
                .push(format!("G2: event {id} rolled back yet reached the broker"));
        }
    }

    // Per aggregate, in id order: which events must have been delivered, and which must not.
    let mut by_key: BTreeMap<&Key, Vec<i64>> = BTreeMap::new();
    for (id, row) in &s.db.rows {
        if row.event != *id {
            // A row the CDC relay wrote for an event without one: judged with its event.
            continue;
        }
        if row.committed {
            v.committed += 1;
            by_key.entry(&row.key).or_default().push(*id);
        } else {
            v.violations
                .push(format!("event {id} is still uncommitted at the end"));
        }
    }
    let mut must_precede: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for (key, ids) in &by_key {
        let mut blocked_by: Option<i64> = None;
        let mut earlier: Vec<i64> = Vec::new();
        for &id in ids {
            let row = &s.db.rows[&id];
            let status = s.db.outcome(id, &s.delivered);
            let n = copies.get(&id).copied().unwrap_or(0);
            if undecodable(row.content, s.cdc) {
                // Not a valid event: dead-lettered under a key of its own, blocking nothing.
                if status == Status::Dead && n == 0 {
                    v.dead += 1;
                } else {
                    v.violations.push(format!(
                        "hostile event {id} is {status:?} with {n} copies at the broker, not dead-lettered"
                    ));
                }
                continue;
            }
            if let Some(head) = blocked_by {
                if n > 0 {
                    v.violations.push(format!(
                        "G4: event {id} of {key:?} reached the broker though {head} before it is dead"
                    ));
                }
                if status == Status::Pending {
                    v.parked += 1;
                } else {
                    v.violations.push(format!(
                        "event {id} of {key:?} is {status:?}, behind dead event {head}: it should be parked"
                    ));
                }
                continue;
            }
            match row.content {
                Content::Good => {
                    match status {
                        Status::Published if n > 0 => {}
                        Status::Published => v.violations.push(format!(
                            "G1/G3: event {id} of {key:?} is marked published but the broker never stored it"
                        )),
                        Status::Pending => v.violations.push(format!(
                            "G1: event {id} of {key:?} is still pending at the end ({n} copies at the broker)"
                        )),
                        Status::Dead => v.violations.push(format!(
                            "event {id} of {key:?} was dead-lettered though the broker accepts it"
                        )),
                    }
                    if let (Some(at), Some(committed)) = (first_at.get(&id), row.committed_at) {
                        v.worst_lag_ms = v.worst_lag_ms.max(at - committed);
                    }
                    must_precede.insert(id, earlier.clone());
                    earlier.push(id);
                }
                Content::Poison | Content::Malformed | Content::Hostile | Content::Oversized => {
                    if status == Status::Dead {
                        v.dead += 1;
                    } else {
                        v.violations.push(format!(
                            "event {id} of {key:?} ({:?}) is {status:?}, not dead-lettered",
                            row.content
                        ));
                    }
                    if n > 0 && matches!(row.content, Content::Malformed | Content::Oversized) {
                        v.violations
                            .push(format!("{:?} event {id} reached the broker", row.content));
                    }
                    // A skipped dead event no longer parks its aggregate.
                    if !s.skipped.contains(&id) {
                        blocked_by = Some(id);
                    }
                }
            }
        }
    }

    // G4 on the broker's log: at each delivery, every earlier good event of the aggregate has
    // been delivered at least once before.
    let mut seen: BTreeSet<i64> = BTreeSet::new();
    for d in &s.deliveries {
        if let Some(earlier) = must_precede.get(&d.id) {
            if let Some(missing) = earlier.iter().find(|e| !seen.contains(e)) {
                v.violations.push(format!(
                    "G4: event {} reached the broker at {} ms before earlier event {missing} of its aggregate",
                    d.id, d.at
                ));
            }
        }
        seen.insert(d.id);
    }
    v
}

/// Whether every committed event has reached its end state (published, dead, or parked behind
/// a dead one) and no transaction is open.
pub fn settled(s: &State) -> bool {
    let mut dead: BTreeSet<&Key> = BTreeSet::new();
    for (id, row) in &s.db.rows {
        if row.event != *id {
            continue;
        }
        if !row.committed || !row.visible {
            return false;
        }
        if undecodable(row.content, s.cdc) {
            if s.db.outcome(*id, &s.delivered) != Status::Dead {
                return false;
            }
            continue;
        }
        match s.db.outcome(*id, &s.delivered) {
            Status::Published => {}
            Status::Dead if s.skipped.contains(id) => {}
            Status::Dead => {
                dead.insert(&row.key);
            }
            Status::Pending if dead.contains(&row.key) => {}
            Status::Pending => return false,
        }
    }
    true
}
