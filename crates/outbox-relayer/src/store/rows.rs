//! Rows as read by the claim, and their decoding into [`Message`]s.

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{routing::RoutingConfig, Message, PublishError};

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
pub(crate) const MAX_TEXT_COLUMN: usize = 4096;

/// The size a row's headers may have (`claim_columns.sql` reads no more).
pub(crate) const MAX_HEADERS: usize = 65536;

impl ClaimedRow {
    /// Why this row, read whole (from the CDC stream), is over the sizes a claim reads of
    /// it (`claim_columns.sql`), in the claim's words; `None` when it is within them. A row
    /// over them is dead-lettered, whichever source read it.
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

    /// Reads a claimed PostgreSQL row. A column the relay cannot decode (text that is not
    /// UTF-8 in a `SQL_ASCII` database, say) makes that row unreadable, not the claim: the row
    /// is dead-lettered with the decoding error, and the other rows go on. Only a row whose id
    /// or partition cannot be read fails the claim.
    pub fn read(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Self::read_at(row, &mut Columns::of(row)?)
    }

    /// [`ClaimedRow::read`] with the columns' positions found already (once per claim). The
    /// columns' types are checked against the fields' until one row has been read with the
    /// checks (every row of one result has the same column types); the rest are decoded
    /// without them, which costs a quarter of a claimed row's reading.
    pub(crate) fn read_at(
        row: &sqlx::postgres::PgRow,
        at: &mut Columns,
    ) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        let [id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, destination, payload, payload_size, content_type, headers, unreadable, occurred_at, partition, attempts, permanent_failures, row_bytes] =
            at.positions;
        let checked = at.types_checked;
        macro_rules! get {
            ($column:expr) => {
                if checked {
                    row.try_get_unchecked($column)
                } else {
                    row.try_get($column)
                }
            };
        }
        let read = || {
            Ok::<_, sqlx::Error>(Self {
                id: get!(id)?,
                event_id: get!(event_id)?,
                aggregate_type: get!(aggregate_type)?,
                aggregate_id: get!(aggregate_id)?,
                aggregate_version: get!(aggregate_version)?,
                event_type: get!(event_type)?,
                schema_version: get!(schema_version)?,
                destination: get!(destination)?,
                payload: get!(payload).map(|p: Option<Vec<u8>>| p.map(Bytes::from))?,
                payload_size: get!(payload_size)?,
                content_type: get!(content_type)?,
                headers: get!(headers)?,
                unreadable: get!(unreadable)?,
                occurred_at: get!(occurred_at)?,
                partition: get!(partition)?,
                attempts: get!(attempts)?,
                permanent_failures: get!(permanent_failures)?,
                row_bytes: get!(row_bytes)?,
            })
        };
        match read() {
            Ok(row) => {
                at.types_checked = true;
                Ok(row)
            }
            Err(error) => Self::unreadable_row(row, &error),
        }
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

    /// [`ClaimedRow::check`], with a panic while checking (a bug the row triggers) turned into
    /// this row's permanent failure instead of the relay's crash: retried and dead-lettered like
    /// any other, never a crash loop.
    pub fn check_guarded(
        &self,
        routing: &RoutingConfig,
        max_payload_bytes: usize,
    ) -> Result<Checked, PublishError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.check(routing, max_payload_bytes)
        }))
        .unwrap_or_else(|panic| {
            Err(PublishError::permanent(format!(
                "the relay panicked decoding this row: {}",
                crate::error::panic_message(&panic)
            )))
        })
    }

    /// Builds the message, or says (permanently) why this row cannot be published.
    pub fn decode(
        &self,
        routing: &RoutingConfig,
        max_payload_bytes: usize,
    ) -> Result<Message, PublishError> {
        let checked = self.check(routing, max_payload_bytes)?;
        Ok(self.clone().into_message(checked))
    }

    /// Checks everything a message needs from this row and routes it: what
    /// [`ClaimedRow::into_message`] then builds the message from, or (permanently) why this
    /// row cannot be published.
    pub fn check(
        &self,
        routing: &RoutingConfig,
        max_payload_bytes: usize,
    ) -> Result<Checked, PublishError> {
        if let Some(reason) = &self.unreadable {
            return Err(PublishError::permanent(reason.clone()));
        }
        // A claim leaves an oversized payload out; a row from the CDC stream carries it whole
        // (so that its dead letter keeps it): refused alike.
        if self
            .payload
            .as_ref()
            .is_none_or(|p| p.len() > max_payload_bytes)
        {
            return Err(PublishError::permanent(format!(
                "payload is {} bytes, over the limit of {max_payload_bytes} bytes",
                self.payload_size
            )));
        }
        let headers = decode_headers(&self.headers)?;
        check_printable("content_type", &self.content_type)?;
        // These travel as broker headers, subjects, keys: the write side's rule holds here too
        // (a CR or LF would end a header line of a text protocol such as NATS).
        check_printable("aggregate_type", &self.aggregate_type)?;
        check_printable("aggregate_id", &self.aggregate_id)?;
        check_printable("event_type", &self.event_type)?;
        if let Some(destination) = &self.destination {
            check_printable("destination", destination)?;
        }
        let occurred_at = self.occurred_at.ok_or_else(|| {
            PublishError::permanent(
                "occurred_at is infinite or after the year 262142, out of the relay's range",
            )
        })?;
        if self.schema_version < 1 {
            return Err(PublishError::permanent(format!(
                "schema_version {} must be 1 or more",
                self.schema_version
            )));
        }
        let destination = routing.route(
            self.destination.as_deref(),
            &self.aggregate_type,
            &self.event_type,
            self.schema_version,
        );
        Ok(Checked {
            headers,
            destination,
            occurred_at,
        })
    }

    /// The message of a row that passed [`ClaimedRow::check`], built from the row's own
    /// strings and payload (nothing is copied).
    pub fn into_message(self, checked: Checked) -> Message {
        Message {
            id: self.id,
            event_id: self.event_id,
            message_id: self.event_id,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            aggregate_version: self.aggregate_version,
            event_type: self.event_type,
            schema_version: self.schema_version,
            destination: checked.destination,
            payload: self.payload.unwrap_or_default(),
            content_type: self.content_type,
            headers: checked.headers,
            occurred_at: checked.occurred_at,
            attempts: self.attempts,
            native_headers: true,
        }
    }
}

/// A claimed row from a PostgreSQL row with the claim's columns (`query_as`): as
/// [`ClaimedRow::read`], a column that does not decode makes the row unreadable, not the read.
impl sqlx::FromRow<'_, sqlx::postgres::PgRow> for ClaimedRow {
    fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Self::read(row)
    }
}

/// Where each column of a claimed PostgreSQL row is: found once per claim (by name, on its
/// first row) and then read by position, since a lookup by name for every column of every
/// row costs more than the read itself.
pub(crate) struct Columns {
    positions: [usize; 18],
    /// Whether a row has been read with its columns' types checked.
    types_checked: bool,
}

impl Columns {
    /// The positions of the claim's columns in `row`.
    pub(crate) fn of(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::{Column, Row};
        const NAMES: [&str; 18] = [
            "id",
            "event_id",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "event_type",
            "schema_version",
            "destination",
            "payload",
            "payload_size",
            "content_type",
            "headers",
            "unreadable",
            "occurred_at",
            "partition",
            "attempts",
            "permanent_failures",
            "row_bytes",
        ];
        let mut at = [0; 18];
        for (slot, name) in at.iter_mut().zip(NAMES) {
            *slot = row.try_column(name)?.ordinal();
        }
        Ok(Self {
            positions: at,
            types_checked: false,
        })
    }
}

/// What [`ClaimedRow::check`] found a row's message needs beyond its own columns.
#[derive(Debug)]
pub struct Checked {
    headers: BTreeMap<String, String>,
    destination: String,
    occurred_at: DateTime<Utc>,
}

/// Parses stored headers (JSON text) into the message's header map. Anything but an object of
/// strings is a permanent error that names what is wrong: JSON the parser refuses (a number out
/// of range, nesting deeper than 128 levels), another kind of value, a bad name or value.
pub(crate) fn decode_headers(text: &str) -> Result<BTreeMap<String, String>, PublishError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        PublishError::permanent(format!("headers are not JSON the relay can read: {e}"))
    })?;
    let object = value.as_object().ok_or_else(|| {
        PublishError::permanent(format!(
            "headers must be a JSON object of strings, found {}",
            kind(&value)
        ))
    })?;
    object
        .iter()
        .map(|(name, v)| {
            let text = v.as_str().ok_or_else(|| {
                PublishError::permanent(format!(
                    "header {} must be a string, found {}",
                    preview(name),
                    kind(v)
                ))
            })?;
            let bad_name = name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if bad_name {
                return Err(PublishError::permanent(format!(
                    "header name {} must be ASCII letters, digits, '-', '_' or '.'",
                    preview(name)
                )));
            }
            if text.contains(['\r', '\n', '\0']) {
                return Err(PublishError::permanent(format!(
                    "header {} contains CR, LF or NUL",
                    preview(name)
                )));
            }
            Ok((name.clone(), text.to_owned()))
        })
        .collect::<Result<BTreeMap<_, _>, _>>()
        .map(first_of_each_name)
}

/// `headers` with one entry per name ignoring ASCII case, the first in byte order: brokers and
/// consumers differ on whether `Traceparent` and `traceparent` are one header, so only one
/// travels.
fn first_of_each_name(mut headers: BTreeMap<String, String>) -> BTreeMap<String, String> {
    // Distinct names without upper case cannot clash: the usual row allocates nothing here.
    if headers.len() < 2
        || headers
            .keys()
            .all(|n| !n.bytes().any(|b| b.is_ascii_uppercase()))
    {
        return headers;
    }
    let mut seen = std::collections::HashSet::new();
    headers.retain(|name, _| seen.insert(name.to_ascii_lowercase()));
    headers
}

/// Refuses, as permanent, a column that is blank or contains control characters.
fn check_printable(column: &str, value: &str) -> Result<(), PublishError> {
    if value.trim().is_empty() || value.chars().any(char::is_control) {
        return Err(PublishError::permanent(format!(
            "{column} {} is empty or contains control characters",
            preview(value)
        )));
    }
    Ok(())
}

/// `value` quoted and escaped for an error message, cut to its first 64 characters: the
/// message is stored in `last_error`, and a column can be megabytes long.
fn preview(value: &str) -> String {
    const MAX: usize = 64;
    match value.char_indices().nth(MAX) {
        None => format!("{value:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &value[..end], value.len()),
    }
}

fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row() -> ClaimedRow {
        ClaimedRow {
            id: 1,
            event_id: Uuid::now_v7(),
            aggregate_type: "order".into(),
            aggregate_id: "1".into(),
            aggregate_version: None,
            event_type: "Placed".into(),
            schema_version: 1,
            destination: None,
            payload: Some(Bytes::from_static(b"{}")),
            payload_size: 2,
            content_type: "application/json".into(),
            headers: json!({"traceparent": "x"}).to_string(),
            unreadable: None,
            occurred_at: Some(Utc::now()),
            partition: 0,
            attempts: 0,
            permanent_failures: 0,
            row_bytes: 2,
        }
    }

    #[test]
    fn decodes_a_good_row_with_default_route() {
        let m = row().decode(&RoutingConfig::default(), 10).unwrap();
        assert_eq!(m.destination, "order.Placed");
        assert_eq!(m.headers["traceparent"], "x");
        assert_eq!(&m.payload[..], b"{}");
    }

    #[test]
    fn two_headers_differing_only_in_case_travel_once() {
        let headers = decode_headers(
            r#"{"traceparent":"b","Traceparent":"a","TRACEPARENT":"c","x-one":"1"}"#,
        )
        .unwrap();
        assert_eq!(
            headers.into_iter().collect::<Vec<_>>(),
            [
                ("TRACEPARENT".to_owned(), "c".to_owned()),
                ("x-one".to_owned(), "1".to_owned())
            ],
            "the first name in byte order"
        );
    }

    #[test]
    fn malformed_rows_are_permanent_errors_that_say_why() {
        let mut cases = Vec::new();
        let mut r = row();
        r.payload = None;
        r.payload_size = 5_000_000;
        cases.push((r, "payload is 5000000 bytes, over the limit of 10 bytes"));
        let mut r = row();
        r.headers = json!(["a"]).to_string();
        cases.push((
            r,
            "headers must be a JSON object of strings, found an array",
        ));
        let mut r = row();
        r.headers = json!({"n": 1}).to_string();
        cases.push((r, "header \"n\" must be a string, found a number"));
        let mut r = row();
        r.headers = "null".into();
        cases.push((r, "found null"));
        let mut r = row();
        r.content_type = "".into();
        cases.push((r, "content_type \"\" is empty"));
        let mut r = row();
        r.headers = json!({"bad name": "v"}).to_string();
        cases.push((r, "header name \"bad name\""));
        // Valid jsonb that a JSON parser refuses: a number out of range, nesting past 128.
        let mut r = row();
        r.headers = r#"{"n": 1e400}"#.into();
        cases.push((
            r,
            "headers are not JSON the relay can read: number out of range",
        ));
        let mut r = row();
        r.headers = format!(r#"{{"n": {}{}}}"#, "[".repeat(300), "]".repeat(300));
        cases.push((
            r,
            "headers are not JSON the relay can read: recursion limit",
        ));
        let mut r = row();
        r.unreadable = Some("event_type is 5000 bytes, over the limit of 4096 bytes".into());
        cases.push((r, "event_type is 5000 bytes"));
        for (r, expected) in cases {
            let err = r.decode(&RoutingConfig::default(), 10).unwrap_err();
            assert!(!err.is_transient());
            assert!(
                err.message.contains(expected),
                "{} vs {expected}",
                err.message
            );
        }
    }
}
