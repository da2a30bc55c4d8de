//! Reading CloudEvents 1.0 messages, so that a consumer takes the relay's output whatever its
//! `envelope` setting (and events from other CloudEvents producers).
//!
//! Both content modes are turned into the relay's native header names, then decoded by the
//! one native decoder:
//!
//! * **binary**: attributes are headers with the binding's prefix (`ce-` for HTTP and NATS,
//!   `ce_` for Kafka, `cloudEvents:` or `cloudEvents_` for AMQP; matched case-insensitively),
//!   the body is the data;
//! * **structured**: the content type is `application/cloudevents+json` and the body is the
//!   JSON event, its data in `data` (JSON, or text) or `data_base64` (bytes).
//!
//! | CloudEvents attribute | native header |
//! | --- | --- |
//! | `id` | `event-id` (with `source`: the inbox key, see below) |
//! | `type` | `event-type` |
//! | `subject` | `aggregate-id` |
//! | `time` | `occurred-at` |
//! | `datacontenttype` | `content-type` |
//! | `schemaversion` (extension) | `schema-version` |
//! | `aggregatetype` (extension) | `aggregate-type` |
//! | `aggregateversion` (extension) | `aggregate-version` |
//!
//! The spec makes `source` + `id` unique per event, not `id` alone: two producers may number
//! their events alike. So a CloudEvent whose `id` is not a UUID has both as its inbox key
//! (`Envelope::message_id`), `ce:{characters in source}:{source}{id}` (or `ce:` and a UUIDv5
//! of that key when it is longer than the inbox's 255 characters). A UUID `id` is unique by
//! construction and is the key alone, as in the relay's native envelope, so one event sent in
//! both envelopes is applied once. `source` is required.

use std::collections::BTreeMap;

use base64::Engine as _;
use bytes::Bytes;
use serde_json::Value;

use crate::DecodeError;

// The mapping is the wire contract's, written once for the relay and the consumers.
use outbox::wire::cloudevents::{
    ATTRIBUTES as NATIVE, BINARY_PREFIXES as PREFIXES, STRUCTURED_CONTENT_TYPE,
};

/// What a CloudEvents message turns into: native headers and the data bytes.
pub(crate) struct Native {
    pub headers: BTreeMap<String, String>,
    pub payload: Bytes,
    /// The `source` attribute.
    pub source: Option<String>,
}

/// `Some` when the message is a CloudEvent (either mode), converted; `None` for a native one.
pub(crate) fn to_native(
    headers: &BTreeMap<String, String>,
    payload: &Bytes,
) -> Option<Result<Native, DecodeError>> {
    let content_type = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.as_str());
    if content_type.is_some_and(is_structured) {
        return Some(structured(payload));
    }
    let attributes: BTreeMap<String, &str> = headers
        .iter()
        .filter_map(|(k, v)| {
            let lower = k.to_ascii_lowercase();
            PREFIXES
                .iter()
                .find_map(|p| lower.strip_prefix(p))
                .map(|name| (name.to_owned(), v.as_str()))
        })
        .collect();
    if !attributes.contains_key("specversion") {
        return None;
    }
    Some(binary(attributes, content_type, payload))
}

pub(crate) fn is_structured(content_type: &str) -> bool {
    let media = content_type.split(';').next().unwrap_or_default().trim();
    media.eq_ignore_ascii_case(STRUCTURED_CONTENT_TYPE)
}

fn check_specversion(version: Option<&str>) -> Result<(), DecodeError> {
    match version {
        Some("1.0") => Ok(()),
        Some(other) => Err(DecodeError(format!(
            "CloudEvents specversion {other:?} is not supported (only \"1.0\")"
        ))),
        None => Err(DecodeError("CloudEvent without specversion".into())),
    }
}

fn native_headers<'a>(
    attributes: impl Iterator<Item = (&'a str, String)>,
) -> BTreeMap<String, String> {
    attributes
        .filter_map(|(name, value)| {
            NATIVE
                .iter()
                .find(|(ce, _)| *ce == name)
                .map(|(_, native)| ((*native).to_owned(), value))
        })
        .collect()
}

fn binary(
    attributes: BTreeMap<String, &str>,
    content_type: Option<&str>,
    payload: &Bytes,
) -> Result<Native, DecodeError> {
    check_specversion(attributes.get("specversion").copied())?;
    let mut headers = native_headers(
        attributes
            .iter()
            .map(|(k, v)| (k.as_str(), (*v).to_owned())),
    );
    if let Some(content_type) = content_type {
        headers
            .entry("content-type".into())
            .or_insert_with(|| content_type.to_owned());
    }
    Ok(Native {
        headers,
        payload: payload.clone(),
        source: attributes.get("source").map(|s| (*s).to_owned()),
    })
}

fn structured(payload: &Bytes) -> Result<Native, DecodeError> {
    let event: serde_json::Map<String, Value> = serde_json::from_slice(payload)
        .map_err(|e| DecodeError(format!("structured CloudEvent is not a JSON object: {e}")))?;
    check_specversion(event.get("specversion").and_then(Value::as_str))?;
    let text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let headers = native_headers(
        event
            .iter()
            .filter_map(|(k, v)| text(v).map(|t| (k.as_str(), t))),
    );
    let data =
        match (event.get("data"), event.get("data_base64")) {
            (Some(_), Some(_)) => {
                return Err(DecodeError(
                    "structured CloudEvent has both data and data_base64".into(),
                ))
            }
            (None, Some(Value::String(b64))) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| DecodeError(format!("CloudEvent data_base64 is not base64: {e}")))?,
            (None, Some(_)) => {
                return Err(DecodeError("CloudEvent data_base64 is not a string".into()))
            }
            (None, None) => Vec::new(),
            // Text data of a non-JSON content type is the text itself; anything else is JSON.
            (Some(Value::String(s)), None) if !is_json(headers.get("content-type")) => {
                s.clone().into_bytes()
            }
            (Some(v), None) => serde_json::to_vec(v).expect("a Value serialises"),
        };
    Ok(Native {
        headers,
        payload: Bytes::from(data),
        source: event.get("source").and_then(text),
    })
}

/// Whether a `datacontenttype` is JSON (absent means JSON, as the JSON format says).
fn is_json(content_type: Option<&String>) -> bool {
    content_type.is_none_or(|t| {
        let media = t.split(';').next().unwrap_or_default().trim();
        media.eq_ignore_ascii_case("application/json")
            || media.to_ascii_lowercase().ends_with("+json")
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::Bytes;
    use serde_json::json;
    use uuid::Uuid;

    use crate::Envelope;

    fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn binary_mode_with_each_bindings_prefix() {
        let id = Uuid::now_v7().to_string();
        for prefix in ["ce-", "ce_", "cloudEvents:", "cloudEvents_", "Ce-"] {
            let h = |name: &str| format!("{prefix}{name}");
            let e = Envelope::decode(
                "orders",
                headers(&[
                    (&h("specversion"), "1.0"),
                    (&h("id"), &id),
                    (&h("type"), "OrderPlaced"),
                    (&h("source"), "/outbox/orders"),
                    (&h("subject"), "o-1"),
                    (&h("time"), "2026-11-30T12:00:00.000001Z"),
                    (&h("schemaversion"), "2"),
                    (&h("aggregatetype"), "order"),
                    (&h("aggregateversion"), "4"),
                    ("content-type", "application/json"),
                    ("traceparent", "00-abc-def-01"),
                ]),
                Bytes::from_static(br#"{"total":1}"#),
            )
            .unwrap_or_else(|e| panic!("{prefix}: {e}"));
            assert_eq!(e.event_id.to_string(), id, "{prefix}");
            assert_eq!(e.event_type, "OrderPlaced");
            assert_eq!(e.schema_version, 2);
            assert_eq!(e.aggregate_type.as_deref(), Some("order"));
            assert_eq!(e.aggregate_id.as_deref(), Some("o-1"));
            assert_eq!(e.aggregate_version, Some(4));
            assert!(e.occurred_at.is_some());
            assert_eq!(e.headers["traceparent"], "00-abc-def-01");
            assert_eq!(e.json::<serde_json::Value>().unwrap()["total"], 1);
        }
    }

    #[test]
    fn structured_mode_with_json_text_and_base64_data() {
        let id = Uuid::now_v7();
        let event = |extra: serde_json::Value| {
            let mut e = json!({
                "specversion": "1.0", "id": id.to_string(), "type": "OrderPlaced",
                "source": "/outbox", "subject": "o-1", "schemaversion": 3,
            });
            e.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            Bytes::from(serde_json::to_vec(&e).unwrap())
        };
        let ct = headers(&[(
            "content-type",
            "application/cloudevents+json; charset=utf-8",
        )]);
        let cases = [
            (json!({"data": {"total": 1}}), br#"{"total":1}"#.to_vec()),
            (
                json!({"datacontenttype": "text/plain", "data": "héllo"}),
                "héllo".as_bytes().to_vec(),
            ),
            (
                json!({"datacontenttype": "application/octet-stream", "data_base64": "AAH/"}),
                vec![0, 1, 255],
            ),
            (json!({}), Vec::new()),
        ];
        for (extra, payload) in cases {
            let e = Envelope::decode("s", ct.clone(), event(extra.clone())).unwrap();
            assert_eq!(e.event_id, id);
            assert_eq!(e.schema_version, 3);
            assert_eq!(e.aggregate_id.as_deref(), Some("o-1"));
            assert_eq!(e.payload.as_ref(), payload.as_slice(), "{extra}");
        }
    }

    #[test]
    fn says_what_is_wrong_with_a_cloudevent() {
        let ct = headers(&[("content-type", "application/cloudevents+json")]);
        let cases: [(BTreeMap<String, String>, &[u8], &str); 5] = [
            (ct.clone(), b"[1]", "structured CloudEvent is not a JSON object"),
            (
                ct.clone(),
                br#"{"specversion":"0.3","id":"x","type":"T"}"#,
                "specversion \"0.3\" is not supported",
            ),
            (
                ct.clone(),
                br#"{"specversion":"1.0","id":"0190b0b0-0000-7000-8000-000000000000","type":"T","data":1,"data_base64":"AA=="}"#,
                "both data and data_base64",
            ),
            (
                ct,
                br#"{"specversion":"1.0","id":"0190b0b0-0000-7000-8000-000000000000","type":"T","data_base64":"%%"}"#,
                "data_base64 is not base64",
            ),
            (
                headers(&[("ce-specversion", "1.0"), ("ce-type", "T")]),
                b"",
                "no event-id",
            ),
        ];
        for (h, body, expected) in cases {
            let err = Envelope::decode("s", h, Bytes::copy_from_slice(body))
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{err} vs {expected}");
        }
    }
}
