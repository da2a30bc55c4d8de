//! The CDC statements on the model (`crates/outbox-relayer/src/postgres/sql/cdc.sql`), statement
//! for statement, each applied atomically. Fenced statements take effect only while the relay
//! holds every lease it names.

use std::collections::BTreeSet;

use outbox_relayer::{
    cdc::{HoldRow, SpillHold, SpillRow, Spilled, StreamPosition},
    store::{ClaimedRow, Fence},
};

use crate::{
    config::WriteMode,
    db::{Db, Hold},
    row::{claimed, partition_of, Content, Key, Row, Status},
    wal::TxnBuilder,
};

impl Db {
    /// Whether `relay_id` holds every one of `fences`.
    fn holds_all(&self, relay_id: &str, fences: &[Fence]) -> bool {
        self.fence(relay_id, fences).len() == fences.len()
    }

    /// `fence_count`, `relay_write`, `spill` and a `hold` for each of `holds` in one
    /// transaction.
    #[allow(clippy::too_many_arguments)]
    pub fn spill(
        &mut self,
        relay_id: &str,
        fences: &[Fence],
        rows: &[SpillRow<'_>],
        holds: &[SpillHold<'_>],
        relay_write_prefix: &str,
        db_now: i64,
        now: i64,
    ) -> Result<Spilled, String> {
        if !self.holds_all(relay_id, fences) {
            return Ok(Spilled::LeaseLost);
        }
        let mut txn = TxnBuilder::default();
        txn.message(relay_write_prefix, Vec::new());
        let mut ids = Vec::with_capacity(rows.len());
        let mut fresh = Vec::with_capacity(rows.len());
        for r in rows {
            let event = self.event_of(r.row.event_id).ok_or_else(|| {
                format!(
                    "the relay spilled event {}, which no writer wrote",
                    r.row.event_id
                )
            })?;
            let original = &self.rows[&event];
            if original.in_table {
                ids.push(event);
                fresh.push(false);
                continue;
            }
            if let Some(copy) = self.copies.get(&event) {
                ids.push(*copy);
                fresh.push(false);
                continue;
            }
            let status = match r.status {
                "pending" => Status::Pending,
                "dead" => Status::Dead,
                other => return Err(format!("spill with status {other:?}")),
            };
            let key: Key = (r.row.aggregate_type.clone(), r.row.aggregate_id.clone());
            let id = self.next_id;
            self.next_id += 1;
            let row = Row {
                partition: partition_of(&key, self.partitions),
                key,
                version: r.row.aggregate_version.unwrap_or(0),
                content: original.content,
                payload: r.row.payload.as_deref().unwrap_or_default().to_vec(),
                committed: true,
                visible: true,
                in_table: true,
                event,
                xid: None,
                status,
                attempts: r.attempts,
                permanent_failures: r.permanent_failures,
                occurred_at: db_now,
                committed_at: Some(now),
            };
            txn.insert(id, &row, r.error.as_deref());
            self.rows.insert(id, row);
            self.copies.insert(event, id);
            ids.push(id);
            fresh.push(true);
        }
        self.wal.commit(txn, db_now);
        for hold in holds {
            let Some(head) = hold.head_id(&ids, &fresh) else {
                continue;
            };
            let key = (hold.key.0.to_owned(), hold.key.1.to_owned());
            let wait_ms = hold.wait_seconds.map(|w| (w * 1000.0) as i64);
            self.hold(
                relay_id,
                fences,
                &key,
                head,
                wait_ms,
                hold.since,
                hold.replace,
                db_now,
            );
        }
        Ok(Spilled::Written { ids, fresh })
    }

    /// `hold`: holds (or parks, `wait_ms` `None`) an aggregate at its row `head_id`; a new
    /// hold records `since`, a moved one keeps its own; without `replace` an existing hold
    /// stays.
    #[allow(clippy::too_many_arguments)]
    pub fn hold(
        &mut self,
        relay_id: &str,
        fences: &[Fence],
        key: &Key,
        head_id: i64,
        wait_ms: Option<i64>,
        since: StreamPosition,
        replace: bool,
        db_now: i64,
    ) -> bool {
        if !self.holds_all(relay_id, fences) {
            return false;
        }
        if !replace && self.holds.contains_key(key) {
            return true;
        }
        if self.rows.get(&head_id).is_some_and(|r| self.visible(r)) {
            let kept = self.holds.get(key).and_then(|h| h.since);
            self.holds.insert(
                key.clone(),
                Hold {
                    event_id: head_id,
                    held_until: wait_ms.map(|w| db_now + w),
                    since: kept.or(Some(since)),
                },
            );
        }
        true
    }

    fn pending_rows<'a>(
        &'a self,
        key: Option<&'a Key>,
    ) -> impl Iterator<Item = (&'a i64, &'a Row)> + 'a {
        self.rows.iter().filter(move |(_, r)| {
            r.status == Status::Pending && self.visible(r) && key.is_none_or(|k| &r.key == k)
        })
    }

    /// `pending_of`: none at or after the head of a hold that is not due.
    pub fn pending_of(
        &self,
        key: &Key,
        limit: i64,
        max_payload: usize,
        db_now: i64,
    ) -> Vec<ClaimedRow> {
        let held_from = self
            .holds
            .get(key)
            .filter(|h| h.held_until.is_none_or(|t| t > db_now))
            .map(|h| h.event_id);
        self.pending_rows(Some(key))
            .filter(|(id, _)| held_from.is_none_or(|head| **id < head))
            .take(limit.max(0) as usize)
            .map(|(id, r)| claimed(*id, r, max_payload))
            .collect()
    }

    /// `catch_up`.
    pub fn catch_up(&self, max_id: i64, limit: i64, max_payload: usize) -> Vec<ClaimedRow> {
        self.pending_rows(None)
            .filter(|(id, r)| **id <= max_id && !self.holds.contains_key(&r.key))
            .take(limit.max(0) as usize)
            .map(|(id, r)| claimed(*id, r, max_payload))
            .collect()
    }

    /// `catch_up_done`: clears the record only if it is still the one caught up to.
    pub fn catch_up_done(&mut self, relay_id: &str, fences: &[Fence], max_id: i64) -> bool {
        let held = self.holds_all(relay_id, fences);
        if held && self.catch_up_max_id == Some(max_id) {
            self.catch_up_max_id = None;
        }
        held
    }

    /// `holds`.
    pub fn hold_rows(&self, db_now: i64) -> Vec<HoldRow> {
        self.holds
            .iter()
            .map(|(key, h)| HoldRow {
                aggregate_type: key.0.clone(),
                aggregate_id: key.1.clone(),
                wait_seconds: h.held_until.map(|t| (t - db_now) as f64 / 1000.0),
                since: h.since,
            })
            .collect()
    }

    /// `unpark`: (leases held, nothing pending).
    pub fn unpark(&mut self, relay_id: &str, fences: &[Fence], key: &Key) -> (bool, bool) {
        let held = self.holds_all(relay_id, fences);
        let free = self.pending_rows(Some(key)).next().is_none();
        if held && free {
            self.holds.remove(key);
        }
        (held, free)
    }

    /// `invisible`: how many of `xids` are committed in the WAL but not visible yet.
    pub fn invisible(&self, xids: &[i64]) -> i64 {
        let hidden: BTreeSet<i64> = self
            .rows
            .values()
            .filter(|r| r.committed && !r.visible)
            .filter_map(|r| r.xid.map(i64::from))
            .collect();
        xids.iter().filter(|x| hidden.contains(x)).count() as i64
    }

    /// A writer's transaction into the WAL at its commit, as its write mode writes it.
    pub fn log_commit(&mut self, ids: &[i64], mode: WriteMode, prefix: &str, db_now: i64) -> u32 {
        let mut txn = TxnBuilder::default();
        for id in ids {
            let row = &self.rows[id];
            match mode {
                WriteMode::Table => txn.insert(*id, row, None),
                WriteMode::ZeroGrowth => {
                    txn.insert(*id, row, None);
                    txn.delete(*id);
                }
                WriteMode::TableLess => txn.message(prefix, table_less_content(*id, row)),
            }
        }
        let xid = self.wal.commit(txn, db_now);
        for id in ids {
            if let Some(row) = self.rows.get_mut(id) {
                row.xid = Some(xid);
            }
        }
        xid
    }
}

/// Whether an event of `content` written in `mode` is not a valid event to the relay: hostile
/// content, and oversized headers in a table-less message (the relay's decoding refuses them,
/// as the library's validation does). Such an event is dead-lettered under a key of its own
/// (`outbox.undecodable`), blocks nothing, and is never replayed (its copy in the table holds
/// the raw message, which would read as an ordinary event).
pub fn undecodable(content: Content, mode: Option<WriteMode>) -> bool {
    content == Content::Hostile
        || (content == Content::Oversized && mode == Some(WriteMode::TableLess))
}

/// The message content of a table-less event, written as hand-written SQL would (payload as
/// text); hostile content is not a valid event.
pub fn table_less_content(id: i64, row: &Row) -> Vec<u8> {
    if row.content == Content::Hostile {
        return hostile_content(id);
    }
    let headers = crate::row::headers_value(row);
    serde_json::json!({
        "v": 1,
        "event_id": uuid::Uuid::from_u128(id as u128),
        "aggregate_type": row.key.0,
        "aggregate_id": row.key.1,
        "aggregate_version": row.version,
        "event_type": crate::row::event_type_of(row),
        "headers": headers,
        "payload": String::from_utf8_lossy(&row.payload),
    })
    .to_string()
    .into_bytes()
}

/// Content that is not a valid event, of several kinds (by `id`): not JSON, a zero schema
/// version, an empty event type, a NUL in the aggregate id, an unknown field.
pub fn hostile_content(id: i64) -> Vec<u8> {
    let good = |extra: (&str, serde_json::Value)| {
        let mut v = serde_json::json!({
            "v": 1,
            "event_id": uuid::Uuid::from_u128(id as u128),
            "aggregate_type": "hostile",
            "aggregate_id": format!("h{id}"),
            "event_type": "Changed",
            "payload": "{}",
        });
        v[extra.0] = extra.1;
        v.to_string().into_bytes()
    };
    match id % 5 {
        0 => format!("{{\"v\":1,\"event_id\":\"{id}").into_bytes(),
        1 => good(("schema_version", serde_json::json!(0))),
        2 => good(("event_type", serde_json::json!(""))),
        3 => good(("aggregate_id", serde_json::json!(format!("h\u{0}{id}")))),
        _ => good(("surprise", serde_json::json!(true))),
    }
}
