//! Logical decoding messages the CDC source reads besides row changes: table-less events
//! (`outbox:{schema}.{table}`), the marker of the relay's own writes, and heartbeats.

use chrono::{DateTime, Utc};
use outbox::{wal::WalEvent, Tables};
use pgwire_replication::Lsn;

use crate::store::ClaimedRow;

/// The prefix of the heartbeat messages that keep an idle slot advancing.
pub fn heartbeat_prefix(tables: &Tables) -> String {
    format!(
        "outbox-heartbeat:{}.{}",
        tables.schema().as_str(),
        tables.events().as_str()
    )
}

/// The prefix of the marker message in the relay's own writes to the table.
pub fn relay_write_prefix(tables: &Tables) -> String {
    format!(
        "outbox-relay-write:{}.{}",
        tables.schema().as_str(),
        tables.events().as_str()
    )
}

/// PostgreSQL's timestamps: microseconds since 2000-01-01 UTC.
pub(super) fn pg_time(micros: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros.checked_add(946_684_800_000_000)?)
}

/// A table-less event as a row (id 0). Content that is not a valid event still becomes a row,
/// under a key of its own, whose decode fails with the reason: it is dead-lettered into the
/// table with its raw bytes, and blocks nothing.
pub(super) fn table_less_row(
    content: &[u8],
    commit_time: Option<DateTime<Utc>>,
    lsn: Lsn,
) -> ClaimedRow {
    let decoded = WalEvent::decode(content).and_then(|w| w.payload_bytes().map(|p| (w, p)));
    match decoded {
        Ok((w, payload)) => {
            let mut row = ClaimedRow {
                id: 0,
                event_id: w.event_id,
                aggregate_type: w.aggregate_type,
                aggregate_id: w.aggregate_id,
                aggregate_version: w.aggregate_version,
                event_type: w.event_type,
                schema_version: w.schema_version,
                destination: w.destination,
                payload_size: payload.len() as i64,
                row_bytes: payload.len() as i64 + 256,
                payload: Some(payload.into()),
                content_type: w.content_type,
                headers: serde_json::to_string(&w.headers).unwrap_or_else(|_| "{}".into()),
                unreadable: None,
                occurred_at: w.occurred_at.or(commit_time),
                partition: 0,
                attempts: 0,
                permanent_failures: 0,
            };
            // Over the sizes a claim reads: a dead letter, as a table row would be.
            row.unreadable = row.over_limits();
            row
        }
        Err(reason) => ClaimedRow {
            id: 0,
            event_id: uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, content),
            aggregate_type: "outbox.undecodable".into(),
            aggregate_id: lsn.to_string(),
            aggregate_version: None,
            event_type: "Undecodable".into(),
            schema_version: 1,
            destination: None,
            payload_size: content.len() as i64,
            payload: Some(bytes::Bytes::copy_from_slice(content)),
            content_type: "application/octet-stream".into(),
            row_bytes: content.len() as i64,
            headers: "{}".into(),
            // Decode refuses it with this reason.
            unreadable: Some(reason),
            occurred_at: commit_time,
            partition: 0,
            attempts: 0,
            permanent_failures: 0,
        },
    }
}
