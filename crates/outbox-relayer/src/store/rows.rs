//! Rows as read by the claim (their checking and decoding into messages is
//! [`crate::dispatch::decode`]'s), and what a claim and a failure record carry.

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A pending row as the claim reads it. Columns written by other languages are taken as they
/// are; [`ClaimedRow::decode`] turns what is wrong with them into a permanent error.
#[derive(Clone, Debug)]
pub struct ClaimedRow {
    /// Row id.
    pub id: i64,
    /// Event id.
    pub event_id: Uuid,
    /// Ordering key, first half.
    pub aggregate_type: String,
    /// Ordering key, second half.
    pub aggregate_id: String,
    /// Writer's per-aggregate sequence.
    pub aggregate_version: Option<i64>,
    /// Event type.
    pub event_type: String,
    /// Payload schema version.
    pub schema_version: i32,
    /// Destination override.
    pub destination: Option<String>,
    /// Payload, absent when over the size limit; shared (not copied) with the message.
    pub payload: Option<Bytes>,
    /// Payload size in bytes.
    pub payload_size: i64,
    /// Content type.
    pub content_type: String,
    /// Headers as stored, as JSON text (should be an object of strings). Kept as text so that
    /// no stored value can fail the read: [`ClaimedRow::decode`] parses it.
    pub headers: String,
    /// Why the store could not read this row as written, when it could not (a column over its
    /// size limit, an event id that is not a UUID, a time it cannot parse): the row is then
    /// dead-lettered with this reason.
    pub unreadable: Option<String>,
    /// When it was written; `None` when the relay cannot represent the stored time
    /// (`infinity`, `-infinity`, or after the year 262142).
    pub occurred_at: Option<DateTime<Utc>>,
    /// Partition.
    pub partition: i32,
    /// Attempts so far (every kind).
    pub attempts: i32,
    /// Permanent failures so far: what `retry.max_attempts` counts.
    pub permanent_failures: i32,
    /// What the row costs the relay in memory: the payload when loaded, headers and text
    /// columns, in bytes (for the byte budget of claims in flight).
    pub row_bytes: i64,
}

/// The size a text column of a row may have (`claim_columns.sql` reads no more).
#[cfg(feature = "postgres")]
pub(crate) const MAX_TEXT_COLUMN: usize = 4096;

/// The size a row's headers may have (`claim_columns.sql` reads no more).
#[cfg(feature = "postgres")]
pub(crate) const MAX_HEADERS: usize = 65536;

impl ClaimedRow {
    /// Why this row, read whole (from the CDC stream), is over the sizes a claim reads of
    /// it (`claim_columns.sql`), in the claim's words; `None` when it is within them. A row
    /// over them is dead-lettered, whichever source read it.
    #[cfg(feature = "postgres")]
    pub(crate) fn over_limits(&self) -> Option<String> {
        let text = [
            ("aggregate_type", self.aggregate_type.len()),
            ("aggregate_id", self.aggregate_id.len()),
            ("event_type", self.event_type.len()),
            (
                "destination",
                self.destination.as_ref().map_or(0, String::len),
            ),
            ("content_type", self.content_type.len()),
        ];
        if let Some((column, len)) = text.iter().find(|(_, len)| *len > MAX_TEXT_COLUMN) {
            return Some(format!(
                "{column} is {len} bytes, over the limit of {MAX_TEXT_COLUMN} bytes"
            ));
        }
        (self.headers.len() > MAX_HEADERS).then(|| {
            format!(
                "headers are {} bytes, over the limit of {MAX_HEADERS} bytes",
                self.headers.len()
            )
        })
    }

    /// What can be read of a row whose columns failed to decode with `error`: a row that
    /// decodes to that error (dead-lettered with it). Fails only when its id or partition
    /// cannot be read either.
    pub(crate) fn unreadable_row<R>(row: &R, error: &sqlx::Error) -> Result<Self, sqlx::Error>
    where
        R: sqlx::Row,
        for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> &'r str: sqlx::ColumnIndex<R>,
    {
        let id: i64 = row.try_get("id")?;
        let text = |name: &str| row.try_get::<String, _>(name).ok();
        Ok(Self {
            id,
            event_id: Uuid::nil(),
            // A key of its own when the real one cannot be read: the failure is recorded
            // against the stored key (the statements use the row's own columns).
            aggregate_type: text("aggregate_type").unwrap_or_else(|| "unreadable".into()),
            aggregate_id: text("aggregate_id").unwrap_or_else(|| format!("row {id}")),
            aggregate_version: None,
            event_type: String::new(),
            schema_version: 1,
            destination: None,
            payload: None,
            payload_size: row.try_get("payload_size").unwrap_or(0),
            content_type: String::new(),
            headers: "{}".into(),
            unreadable: Some(format!("the relay cannot read this row: {error}")),
            occurred_at: None,
            partition: row.try_get("partition")?,
            attempts: row.try_get("attempts").unwrap_or(0),
            permanent_failures: row.try_get("permanent_failures").unwrap_or(0),
            row_bytes: row.try_get("row_bytes").unwrap_or(0),
        })
    }

    /// The ordering key.
    pub fn aggregate_key(&self) -> (&str, &str) {
        (&self.aggregate_type, &self.aggregate_id)
    }
}

/// A failed attempt to record.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// Row id.
    pub id: i64,
    /// The error text stored in `last_error`.
    pub error: String,
    /// Delay before the next attempt (ignored when dead).
    pub backoff: Duration,
    /// Whether the event is now dead.
    pub dead: bool,
    /// Whether the failure was permanent (counted against `retry.max_attempts`).
    pub permanent: bool,
}

/// Longest error text stored in `last_error` (bytes): a broker's answer can be any size.
pub const MAX_ERROR_TEXT: usize = 4096;

/// An error as `last_error` can store it on every database: NUL characters (which
/// PostgreSQL's text cannot hold: the write would be refused for ever) replaced by U+FFFD, and
/// cut to [`MAX_ERROR_TEXT`] bytes at a character boundary.
pub fn storable_error(text: &str) -> String {
    let mut text = text.replace('\0', "\u{fffd}");
    let mut end = text.len().min(MAX_ERROR_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// What one claim read.
#[derive(Clone, Debug, Default)]
pub struct Claimed {
    /// The rows, in claim order.
    pub rows: Vec<ClaimedRow>,
    /// Whether the scan found more rows than the byte budget let through: more work is waiting.
    pub cut: bool,
}
