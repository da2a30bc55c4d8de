//! The application: writers that insert events in transactions, some of which commit late and
//! some of which roll back. Each aggregate belongs to one writer, which writes its events one
//! transaction after another (as an application holding the aggregate's row lock does), so an
//! aggregate's order is its id order; different writers' transactions interleave freely.

use std::{collections::BTreeMap, sync::Arc};

use crate::{
    config::WriteMode,
    db_cdc::{table_less_content, undecodable},
    row::{payload_for, Content, Key},
    world::World,
};

/// The prefix of table-less events' messages.
fn event_prefix() -> String {
    outbox::wal::prefix(&crate::cdc::outbox_tables())
}

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
                let mode = s.cdc;
                let content = if s.chance(faults.poison) {
                    Content::Poison
                } else if s.chance(faults.malformed) {
                    // Half of the hostile rows are over the claim's size limits; the rest
                    // are malformed (hostile table-less content when there is no row).
                    if s.chance(0.5) {
                        Content::Oversized
                    } else if mode == Some(WriteMode::TableLess) {
                        Content::Hostile
                    } else {
                        Content::Malformed
                    }
                } else {
                    Content::Good
                };
                let payload = payload_for(version, content);
                let in_table = mode.is_none_or(|m| m == WriteMode::Table);
                let id =
                    s.db.insert_row(key.clone(), version, content, payload, db_now, in_table);
                if undecodable(content, mode) {
                    // The relay names undecodable content by a digest of the message.
                    let message = table_less_content(id, &s.db.rows[&id]);
                    let uuid = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, &message);
                    s.db.uuids.insert(uuid, id);
                }
                ids.push(id);
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
                None
            } else {
                s.db.commit(&ids, now);
                let mut hidden_ms = 0;
                if let Some(mode) = s.cdc {
                    let db_now = now + s.skew_ms;
                    let xid = s.db.log_commit(&ids, mode, &event_prefix(), db_now);
                    // A commit waiting for a synchronous standby: in the WAL (and the stream)
                    // before queries see it.
                    let late = s.faults.invisible_commit;
                    // (Only once the slot exists: a commit still invisible when the slot is
                    // created and through the whole catch-up is a known gap, in
                    // docs/reliability.md.)
                    if s.db.wal.slot_exists && s.chance(late) {
                        hidden_ms = s.between(50, 3000);
                        for id in &ids {
                            s.db.rows.get_mut(id).expect("inserted").visible = false;
                        }
                    }
                    s.trace(now, || {
                        format!(
                            "writer{writer} COMMIT {ids:?} xid {xid} (visible in {hidden_ms} ms)"
                        )
                    });
                } else {
                    s.trace(now, || format!("writer{writer} COMMIT {ids:?}"));
                }
                Some(hidden_ms)
            }
        };
        let committed = match committed {
            Some(hidden_ms) if hidden_ms > 0 => {
                world.sleep_ms(hidden_ms).await;
                let now = world.now();
                let mut s = world.lock();
                for id in &ids {
                    s.db.rows.get_mut(id).expect("committed").visible = true;
                }
                s.trace(now, || format!("writer{writer} VISIBLE {ids:?}"));
                true
            }
            other => other.is_some(),
        };
        if committed {
            *next_version.get_mut(&key).expect("own key") += ids.len() as i64;
            world.commits.notify_waiters();
        }
    }
}
