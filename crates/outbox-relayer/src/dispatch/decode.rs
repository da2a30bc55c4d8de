//! A claimed row checked and routed: the message it is published as, or (permanently) why it
//! cannot be published.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::{
    publisher::PublishError, store::ClaimedRow, wire::message::Message,
    wire::routing::RoutingConfig,
};

impl ClaimedRow {
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::json;
    use uuid::Uuid;

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
