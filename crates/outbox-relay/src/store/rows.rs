//! Rows as read by the claim, and their decoding into [`Message`]s.

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{routing::RoutingConfig, Message, PublishError};

/// A pending row as the claim reads it. Columns written by other languages are taken as they
/// are; [`ClaimedRow::decode`] turns what is wrong with them into a permanent error.
#[derive(Clone, Debug, sqlx::FromRow)]
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
    /// Payload, absent when over the size limit.
    pub payload: Option<Vec<u8>>,
    /// Payload size in bytes.
    pub payload_size: i64,
    /// Content type.
    pub content_type: String,
    /// Headers as stored (should be an object of strings).
    pub headers: serde_json::Value,
    /// When it was written; `None` when the relay cannot represent the stored time
    /// (`infinity`, `-infinity`, or after the year 262142).
    pub occurred_at: Option<DateTime<Utc>>,
    /// Partition.
    pub partition: i32,
    /// Attempts so far.
    pub attempts: i32,
}

impl ClaimedRow {
    /// The ordering key.
    pub fn aggregate_key(&self) -> (&str, &str) {
        (&self.aggregate_type, &self.aggregate_id)
    }

    /// Builds the message, or says (permanently) why this row cannot be published.
    pub fn decode(
        &self,
        routing: &RoutingConfig,
        max_payload_bytes: usize,
    ) -> Result<Message, PublishError> {
        // A claim leaves an oversized payload out; a row from the CDC stream carries it whole
        // (so that its dead letter keeps it): refused alike.
        let payload = self
            .payload
            .as_ref()
            .filter(|p| p.len() <= max_payload_bytes)
            .ok_or_else(|| {
                PublishError::permanent(format!(
                    "payload is {} bytes, over the limit of {max_payload_bytes} bytes",
                    self.payload_size
                ))
            })?;
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
        Ok(Message {
            id: self.id,
            event_id: self.event_id,
            message_id: self.event_id,
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            aggregate_version: self.aggregate_version,
            event_type: self.event_type.clone(),
            schema_version: self.schema_version,
            destination,
            payload: Bytes::copy_from_slice(payload),
            content_type: self.content_type.clone(),
            headers,
            occurred_at,
            attempts: self.attempts,
            native_headers: true,
        })
    }
}

fn decode_headers(value: &serde_json::Value) -> Result<BTreeMap<String, String>, PublishError> {
    let object = value.as_object().ok_or_else(|| {
        PublishError::permanent(format!(
            "headers must be a JSON object of strings, found {}",
            kind(value)
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
        .collect()
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
            payload: Some(b"{}".to_vec()),
            payload_size: 2,
            content_type: "application/json".into(),
            headers: json!({"traceparent": "x"}),
            occurred_at: Some(Utc::now()),
            partition: 0,
            attempts: 0,
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
    fn malformed_rows_are_permanent_errors_that_say_why() {
        let mut cases = Vec::new();
        let mut r = row();
        r.payload = None;
        r.payload_size = 5_000_000;
        cases.push((r, "payload is 5000000 bytes, over the limit of 10 bytes"));
        let mut r = row();
        r.headers = json!(["a"]);
        cases.push((
            r,
            "headers must be a JSON object of strings, found an array",
        ));
        let mut r = row();
        r.headers = json!({"n": 1});
        cases.push((r, "header \"n\" must be a string, found a number"));
        let mut r = row();
        r.headers = serde_json::Value::Null;
        cases.push((r, "found null"));
        let mut r = row();
        r.content_type = "".into();
        cases.push((r, "content_type \"\" is empty"));
        let mut r = row();
        r.headers = json!({"bad name": "v"});
        cases.push((r, "header name \"bad name\""));
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
