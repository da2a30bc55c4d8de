//! The operators' statements on the model (`crates/outbox-relayer/src/postgres/sql/admin.sql`,
//! `mysql/sql/admin.sql` and `sqlite/sql/admin.sql`, which the store conformance suite holds to the same results):
//! `replay` of dead events and `skip` of one, each applied atomically, whether relays run or not.

use crate::{
    db::Db,
    row::{Key, Status},
};

impl Db {
    /// The first pending visible row of an aggregate.
    fn first_pending(&self, key: &Key) -> Option<i64> {
        self.rows
            .iter()
            .find(|(_, r)| &r.key == key && r.status == Status::Pending && self.visible(r))
            .map(|(id, _)| *id)
    }

    /// `replay` of dead rows `ids`: pending again, their counters reset; each aggregate's hold
    /// on its first pending row, due at once, unless the aggregate is parked on a dead row
    /// the replay leaves dead: then it stays parked, and the rows before that one are not
    /// replayed. Returns how many were replayed.
    pub fn replay(&mut self, ids: &[i64], db_now: i64) -> i64 {
        let dead = |db: &Self, id: &i64| {
            db.rows
                .get(id)
                .is_some_and(|r| r.status == Status::Dead && db.visible(r))
        };
        // The parks the replay leaves in place.
        let kept: Vec<(Key, i64)> = self
            .holds
            .iter()
            .filter(|(key, h)| {
                h.held_until.is_none()
                    && !ids.contains(&h.event_id)
                    && dead(self, &h.event_id)
                    && &self.rows[&h.event_id].key == *key
            })
            .map(|(key, h)| (key.clone(), h.event_id))
            .collect();
        let parked_after = |key: &Key, id: i64| kept.iter().any(|(k, e)| k == key && *e > id);
        let parked = |key: &Key| kept.iter().any(|(k, _)| k == key);
        let mut resumed: Vec<Key> = Vec::new();
        let mut replayed = 0;
        for id in ids {
            if !dead(self, id) || parked_after(&self.rows[id].key, *id) {
                continue;
            }
            let row = self.rows.get_mut(id).expect("found");
            row.status = Status::Pending;
            row.attempts = 0;
            row.permanent_failures = 0;
            replayed += 1;
            if !parked(&row.key) && !resumed.contains(&row.key) {
                resumed.push(row.key.clone());
            }
        }
        for key in resumed {
            let head = self.first_pending(&key).expect("a replayed row is pending");
            self.upsert_hold(&key, head, Some(db_now));
        }
        replayed
    }

    /// `skip` of dead row `id`: when it holds its aggregate's hold, the hold moves to the first
    /// pending row, due at once, or goes. Says whether it released a hold.
    pub fn skip(&mut self, id: i64, db_now: i64) -> bool {
        let Some(row) = self.rows.get(&id) else {
            return false;
        };
        let key = row.key.clone();
        let target = row.status == Status::Dead
            && self.visible(row)
            && self.holds.get(&key).is_some_and(|h| h.event_id == id);
        if !target {
            return false;
        }
        match self.first_pending(&key) {
            Some(head) => {
                self.upsert_hold(&key, head, Some(db_now));
            }
            None => {
                self.holds.remove(&key);
            }
        }
        true
    }
}
