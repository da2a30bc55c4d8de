//! One outbox row as the model holds it, and the columns the relay reads from it: what the
//! database, its WAL and the CDC model share.

use chrono::{DateTime, TimeZone, Utc};
use outbox_relayer::store::ClaimedRow;

/// An aggregate: (type, id).
pub type Key = (String, String);

/// Status column of an outbox row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Waiting to be published.
    Pending,
    /// Acknowledged and marked.
    Published,
    /// Dead-lettered.
    Dead,
}

/// What a writer put in a row, beyond the ordering key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// A good event.
    Good,
    /// An event the broker always rejects (a permanent failure).
    Poison,
    /// A row written by another program with headers that are not a JSON object.
    Malformed,
    /// A table-less event whose message is not a valid event (hand-written, or of a foreign
    /// program): its aggregate cannot be known, so it blocks nothing; it must be dead-lettered.
    Hostile,
    /// A row written by another program with headers over the claim's limit (64 KiB as JSON
    /// text): unreadable whole, whichever path reads it (the claim, the CDC catch-up, the
    /// stream, the spill); it must be dead-lettered and never reach the broker.
    Oversized,
}

/// The most bytes of headers (as JSON text) a claim reads (`claim_columns.sql`).
const CLAIM_HEADERS_LIMIT: usize = 65_536;

/// The headers of an [`Content::Oversized`] row: one byte over the claim's limit.
const OVERSIZED_HEADERS: usize = CLAIM_HEADERS_LIMIT + 1;

/// One outbox row.
#[derive(Clone, Debug)]
pub struct Row {
    /// Ordering key.
    pub key: Key,
    /// Per-aggregate version.
    pub version: i64,
    /// Partition, as the writer computed it.
    pub partition: i32,
    /// What the row holds.
    pub content: Content,
    /// The payload column.
    pub payload: Vec<u8>,
    /// Whether its transaction committed (it is in the WAL).
    pub committed: bool,
    /// Whether queries see it: its transaction committed and is visible (a commit waiting for
    /// a synchronous standby is in the WAL first), and the row is in the table.
    pub visible: bool,
    /// False for an event written without a row (zero-growth: inserted and deleted in its
    /// transaction; table-less: a WAL message): the ground truth of the event, which no
    /// statement sees.
    pub in_table: bool,
    /// The event the row carries: its own id for a writer's row, the original event's for a
    /// row the CDC relay wrote into the table (its table path).
    pub event: i64,
    /// Its transaction's id in the WAL, once committed (CDC).
    pub xid: Option<u32>,
    /// Status column.
    pub status: Status,
    /// Attempts column.
    pub attempts: i32,
    /// Permanent failures column.
    pub permanent_failures: i32,
    /// Insert time, database clock (ms).
    pub occurred_at: i64,
    /// Commit time, virtual clock (ms): what lag is measured from.
    pub committed_at: Option<i64>,
}

/// Milliseconds of the database clock as a timestamp.
pub fn timestamp(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(1_800_000_000_000 + ms)
        .single()
        .expect("in range")
}

/// The payload a writer gives an event of `version` with `content`: the broker rejects
/// `poison`.
pub fn payload_for(version: i64, content: Content) -> Vec<u8> {
    match content {
        Content::Poison => b"poison".to_vec(),
        _ => format!("{{\"v\":{version}}}").into_bytes(),
    }
}

/// The partition of an aggregate key (FNV-1a; any fixed hash will do).
pub fn partition_of(key: &Key, partitions: i32) -> i32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.0.bytes().chain([0]).chain(key.1.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % partitions as u64) as i32
}

pub(crate) fn claimed(id: i64, row: &Row, max_payload: usize) -> ClaimedRow {
    let payload = row.payload.clone();
    let payload_loaded = if payload.len() <= max_payload {
        payload.len()
    } else {
        0
    };
    // As `claim_columns.sql` reads headers over its limit: `{}`, and the row unreadable.
    let mut headers = headers_of(row);
    let unreadable = (headers.len() > CLAIM_HEADERS_LIMIT).then(|| {
        format!(
            "headers are {} bytes, over the limit of {CLAIM_HEADERS_LIMIT} bytes",
            headers.len()
        )
    });
    if unreadable.is_some() {
        headers = "{}".to_owned();
    }
    ClaimedRow {
        id,
        event_id: uuid::Uuid::from_u128(row.event as u128),
        aggregate_type: row.key.0.clone(),
        aggregate_id: row.key.1.clone(),
        aggregate_version: Some(row.version),
        event_type: event_type_of(row).to_owned(),
        schema_version: 1,
        destination: None,
        payload_size: payload.len() as i64,
        payload: (payload.len() <= max_payload).then_some(payload.into()),
        content_type: "application/json".to_owned(),
        row_bytes: (payload_loaded + headers.len() + 64) as i64,
        headers,
        unreadable,
        occurred_at: Some(timestamp(row.occurred_at)),
        partition: row.partition,
        attempts: row.attempts,
        permanent_failures: row.permanent_failures,
    }
}

/// The event type of a row: it alternates with the version, so that with the default routing
/// (`{aggregate_type}.{event_type}`) an aggregate's events go to two destinations, and one of
/// them can hang while the other answers.
pub fn event_type_of(row: &Row) -> &'static str {
    if row.version % 2 == 0 {
        "Changed"
    } else {
        "Renamed"
    }
}

/// The headers column of a row, as JSON text: not an object for a malformed row.
pub fn headers_of(row: &Row) -> String {
    headers_value(row).to_string()
}

/// The headers of a row as JSON: not an object for a malformed row, over the claim's limit
/// for an oversized one.
pub fn headers_value(row: &Row) -> serde_json::Value {
    match row.content {
        Content::Malformed => serde_json::json!(["not", "an", "object"]),
        Content::Oversized => {
            // `{"sim-pad":"…"}` is 14 bytes around the padding.
            serde_json::json!({ "sim-pad": "x".repeat(OVERSIZED_HEADERS - 14) })
        }
        _ => serde_json::json!({ "sim-version": row.version.to_string() }),
    }
}
