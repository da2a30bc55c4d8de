//! The application: writers that insert events in transactions, some of which commit late and
//! some of which roll back. Each aggregate belongs to one writer, which writes its events one
//! transaction after another (as an application holding the aggregate's row lock does), so an
//! aggregate's order is its id order; different writers' transactions interleave freely.

use std::{collections::BTreeMap, sync::Arc};

use crate::{
    db::{payload_for, Content, Key},
    world::World,
};

/// Writes into `keys` until virtual time `until` (ms).
pub async fn write(world: Arc<World>, writer: usize, keys: Vec<Key>, until: i64) {
    let mut next_version: BTreeMap<Key, i64> = keys.iter().map(|k| (k.clone(), 1)).collect();
    loop {
        world.latency(1, 40).await;
        let now = world.now();
        if now >= until || keys.is_empty() {
            return;
        }
        // BEGIN; INSERT …; (the application's own work)
        let (key, ids, hold) = {
            let mut s = world.lock();
            if now < s.database_down_until {
                continue;
            }
            let key = keys[s.between(0, keys.len() as i64 - 1) as usize].clone();
            let n = s.between(1, 3);
            let faults = s.faults.clone();
            let db_now = now + s.skew_ms;
            let first = next_version[&key];
            let mut ids = Vec::new();
            for version in first..first + n {
                let content = if s.chance(faults.poison) {
                    Content::Poison
                } else if s.chance(faults.malformed) {
                    Content::Malformed
                } else {
                    Content::Good
                };
                let payload = payload_for(version, content);
                ids.push(s.db.insert(key.clone(), version, content, payload, db_now));
            }
            let hold = if s.chance(faults.long_transaction) {
                s.between(500, 4000)
            } else {
                s.between(0, 10)
            };
            s.trace(now, || format!("writer{writer} BEGIN {key:?} {ids:?}"));
            (key, ids, hold)
        };
        world.sleep_ms(hold).await;
        // COMMIT or ROLLBACK.
        let now = world.now();
        let committed = {
            let mut s = world.lock();
            let rollback = s.faults.rollback;
            let lost = now < s.database_down_until;
            if lost || s.chance(rollback) {
                s.db.rollback(&ids);
                s.rolled_back.extend(&ids);
                s.trace(now, || {
                    format!("writer{writer} ROLLBACK {ids:?} (restart: {lost})")
                });
                false
            } else {
                s.db.commit(&ids, now);
                s.trace(now, || format!("writer{writer} COMMIT {ids:?}"));
                true
            }
        };
        if committed {
            *next_version.get_mut(&key).expect("own key") += ids.len() as i64;
            world.commits.notify_waiters();
        }
    }
}
