//! The event format of the table-less outbox: one transactional logical decoding message per
//! event, written with `pg_logical_emit_message(true, prefix, content)` in the caller's
//! transaction and published by the CDC relay. The message exists only in the WAL: it reaches
//! the relay if and only if the transaction commits (G2), and no table grows.
//!
//! The content is a JSON object (any language can write it; see `docs/operations.md`, "CDC",
//! its write modes):
//!
//! ```json
//! {"v": 1, "event_id": "0192f0c4-7d1e-7b3a-9c55-1d2e3f405162",
//!  "aggregate_type": "order", "aggregate_id": "42", "aggregate_version": 7,
//!  "event_type": "OrderPlaced", "schema_version": 1, "destination": null,
//!  "content_type": "application/json", "headers": {"traceparent": "00-…"},
//!  "occurred_at": "2026-12-01T10:00:00Z", "payload_base64": "eyJvcmRlcl9pZCI6NDJ9"}
//! ```
//!
//! `payload_base64` carries the payload bytes; a writer may give `payload` (a UTF-8 string,
//! taken byte for byte) instead. Only `v`, `event_id`, `aggregate_type`, `aggregate_id`,
//! `event_type` and one of the payload fields are required; `occurred_at` defaults to the
//! commit time.

use std::collections::BTreeMap;

use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{
    event::{Event, DEFAULT_CONTENT_TYPE},
    ident::Tables,
};

/// Version of the content format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The logical message prefix of an outbox's events: `outbox:{schema}.{table}`.
pub fn prefix(tables: &Tables) -> String {
    format!(
        "outbox:{}.{}",
        tables.schema().as_str(),
        tables.events().as_str()
    )
}

/// One event as carried by a logical decoding message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WalEvent {
    /// Format version ([`FORMAT_VERSION`]).
    pub v: u32,
    /// Idempotency key.
    pub event_id: Uuid,
    /// Ordering key, first half.
    pub aggregate_type: String,
    /// Ordering key, second half.
    pub aggregate_id: String,
    /// Optional per-aggregate sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_version: Option<i64>,
    /// What the payload is.
    pub event_type: String,
    /// Payload schema version (default 1).
    #[serde(default = "one")]
    pub schema_version: i32,
    /// Destination override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// Payload content type (default `application/json`).
    #[serde(default = "default_content_type")]
    pub content_type: String,
    /// String headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// When it happened (default: the commit time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occurred_at: Option<DateTime<Utc>>,
    /// The payload, base64 (standard alphabet, padded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    /// The payload as UTF-8 text, for hand-written SQL (instead of `payload_base64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

fn one() -> i32 {
    1
}

fn default_content_type() -> String {
    DEFAULT_CONTENT_TYPE.into()
}

impl WalEvent {
    /// The message content for `event`.
    pub fn encode(event: &Event) -> Vec<u8> {
        let wal = Self {
            v: FORMAT_VERSION,
            event_id: event.event_id,
            aggregate_type: event.aggregate_type.clone(),
            aggregate_id: event.aggregate_id.clone(),
            aggregate_version: event.aggregate_version,
            event_type: event.event_type.clone(),
            schema_version: event.schema_version,
            destination: event.destination.clone(),
            content_type: event.content_type.clone(),
            headers: event.stored_headers().into_owned(),
            occurred_at: event.occurred_at,
            payload_base64: Some(base64::engine::general_purpose::STANDARD.encode(&event.payload)),
            payload: None,
        };
        serde_json::to_vec(&wal).expect("a WalEvent always serialises")
    }

    /// Reads message content; the error says what is wrong with it.
    pub fn decode(content: &[u8]) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_slice(content)
            .map_err(|e| format!("table-less event is not JSON: {e}"))?;
        // Name the field serde would not: the UUID.
        if let Some(id) = value.get("event_id") {
            if id.as_str().and_then(|s| Uuid::parse_str(s).ok()).is_none() {
                return Err(format!(
                    "table-less event: event_id must be a UUID, found {id}"
                ));
            }
        }
        let wal: Self = serde_json::from_value(value)
            .map_err(|e| format!("table-less event is not a valid event object: {e}"))?;
        if wal.v != FORMAT_VERSION {
            return Err(format!(
                "table-less event format version {} is not supported (this relay reads {})",
                wal.v, FORMAT_VERSION
            ));
        }
        if wal.payload.is_some() == wal.payload_base64.is_some() {
            return Err("table-less event needs exactly one of payload, payload_base64".into());
        }
        // The rules of a written event (and of the table's columns: no NUL in text, no empty
        // names, schema version 1 or more), so that hand-written content the table would
        // refuse is a dead letter with its reason, not a row the relay cannot write.
        Event {
            event_id: wal.event_id,
            aggregate_type: wal.aggregate_type.clone(),
            aggregate_id: wal.aggregate_id.clone(),
            aggregate_version: wal.aggregate_version,
            event_type: wal.event_type.clone(),
            schema_version: wal.schema_version,
            destination: wal.destination.clone(),
            payload: Vec::new(),
            content_type: wal.content_type.clone(),
            headers: wal.headers.clone(),
            occurred_at: wal.occurred_at,
        }
        .validate(usize::MAX)
        .map_err(|e| format!("table-less event: {e}"))?;
        Ok(wal)
    }

    /// The payload bytes.
    pub fn payload_bytes(&self) -> Result<Vec<u8>, String> {
        match (&self.payload, &self.payload_base64) {
            (Some(text), _) => Ok(text.as_bytes().to_vec()),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("payload_base64 is not valid base64: {e}")),
            (None, None) => Err("table-less event has no payload".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_an_event() {
        let event = Event::new("order", "42", "OrderPlaced")
            .payload(vec![0, 1, 255], "application/octet-stream")
            .aggregate_version(3)
            .header("traceparent", "t");
        let wal = WalEvent::decode(&WalEvent::encode(&event)).unwrap();
        assert_eq!(wal.event_id, event.id());
        assert_eq!(wal.aggregate_version, Some(3));
        assert_eq!(wal.payload_bytes().unwrap(), vec![0, 1, 255]);
        assert_eq!(wal.headers["traceparent"], "t");
    }

    #[test]
    fn content_the_table_would_refuse_is_refused_with_its_field() {
        let base = r#""v":1,"event_id":"0192f0c4-7d1e-7b3a-9c55-1d2e3f405162","payload":"{}""#;
        for (fields, field) in [
            (
                r#""aggregate_type":"","aggregate_id":"1","event_type":"T""#,
                "aggregate_type",
            ),
            (
                r#""aggregate_type":"a","aggregate_id":"1","event_type":"T\u0000x""#,
                "event_type",
            ),
            (
                r#""aggregate_type":"a","aggregate_id":"1","event_type":"T","schema_version":0"#,
                "schema_version",
            ),
            (
                r#""aggregate_type":"a","aggregate_id":"1","event_type":"T","aggregate_version":-1"#,
                "aggregate_version",
            ),
            (
                r#""aggregate_type":"a","aggregate_id":"1","event_type":"T","headers":{"h":"a\u0000"}"#,
                "headers.h",
            ),
        ] {
            let content = format!("{{{base},{fields}}}");
            let error = WalEvent::decode(content.as_bytes()).unwrap_err();
            assert!(error.contains(field), "{content}: {error}");
        }
    }

    #[test]
    fn hand_written_content_with_defaults() {
        let wal = WalEvent::decode(
            br#"{"v":1,"event_id":"0192f0c4-7d1e-7b3a-9c55-1d2e3f405162","aggregate_type":"order",
                "aggregate_id":"42","event_type":"OrderPlaced","payload":"{\"a\":1}"}"#,
        )
        .unwrap();
        assert_eq!(wal.schema_version, 1);
        assert_eq!(wal.content_type, "application/json");
        assert_eq!(wal.payload_bytes().unwrap(), br#"{"a":1}"#);
    }

    #[test]
    fn bad_content_names_the_problem() {
        for (content, expected) in [
            (&b"not json"[..], "not JSON"),
            (br#"{"v":1}"#, "not a valid event object"),
            (br#"{"v":2,"event_id":"0192f0c4-7d1e-7b3a-9c55-1d2e3f405162","aggregate_type":"a","aggregate_id":"1","event_type":"E","payload":""}"#, "version 2"),
            (br#"{"v":1,"event_id":"0192f0c4-7d1e-7b3a-9c55-1d2e3f405162","aggregate_type":"a","aggregate_id":"1","event_type":"E"}"#, "exactly one of payload"),
            (br#"{"v":1,"event_id":"x","aggregate_type":"a","aggregate_id":"1","event_type":"E","payload":""}"#, "event_id"),
        ] {
            let err = WalEvent::decode(content).unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
    }
}
