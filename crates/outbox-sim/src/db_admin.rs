//! The operators' statements on the model (`crates/outbox-relay/src/admin/sql/postgres.sql`,
//! and `sqlite.sql`, which the store conformance suite holds to the same results):
//! `replay` and `skip` of one dead event, each applied atomically, whether relays run or not.

use crate::db::{Db, Key, Status};

impl Db {
    /// The first pending visible row of an aggregate.
    fn first_pending(&self, key: &Key) -> Option<i64> {
        self.rows
            .iter()
            .find(|(_, r)| &r.key == key && r.status == Status::Pending && self.visible(r))
            .map(|(id, _)| *id)
    }

    /// `replay` of dead row `id`: pending again, its counters reset; its aggregate's hold on
    /// its first pending row, due at once. Says whether it was dead.
    pub fn replay(&mut self, id: i64, db_now: i64) -> bool {
        let Some(row) = self.rows.get(&id) else {
            return false;
        };
        if row.status != Status::Dead || !self.visible(row) {
            return false;
        }
        let row = self.rows.get_mut(&id).expect("found");
        row.status = Status::Pending;
        row.attempts = 0;
        row.permanent_failures = 0;
        let key = row.key.clone();
        let head = self
            .first_pending(&key)
            .expect("the replayed row is pending");
        self.upsert_hold(&key, head, Some(db_now));
        true
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
