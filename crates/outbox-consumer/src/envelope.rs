use std::collections::BTreeMap;

use bytes::Bytes;
use chrono::{DateTime, FixedOffset, Utc};
use outbox::wire::header;
use uuid::Uuid;

use crate::cloudevents;

/// An outbox event as a consumer receives it: the relay's standard headers (or CloudEvents
/// attributes), decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    /// The event id. For a producer whose ids are not UUIDs (a CloudEvents `id` such as
    /// `"A234-1234-1234"`), a UUIDv5 of that id: stable, so its redeliveries share it.
    pub event_id: Uuid,
    /// The id the inbox records: the event id's lowercase hyphenated form, or a producer's
    /// non-UUID id as sent (1 to 255 characters); for a CloudEvent, its `source` and `id`
    /// together (see the module `cloudevents`).
    pub message_id: String,
    /// The event type.
    pub event_type: String,
    /// The payload's schema version (1 when absent).
    pub schema_version: i32,
    /// Aggregate type, if sent.
    pub aggregate_type: Option<String>,
    /// Aggregate id, if sent.
    pub aggregate_id: Option<String>,
    /// Aggregate version, if sent.
    pub aggregate_version: Option<i64>,
    /// When the event happened, if sent.
    pub occurred_at: Option<DateTime<Utc>>,
    /// On a fan-out copy: the schema version of the stored event it was made from (the event
    /// itself went to its own destination). `None` on the event's own message.
    pub copy_of_schema_version: Option<i32>,
    /// Subject or routing key it arrived on.
    pub destination: String,
    /// Every header as received.
    pub headers: BTreeMap<String, String>,
    /// The payload bytes.
    pub payload: Bytes,
}

/// Why a message is not a valid outbox event. Such messages are dead-lettered at once.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed message: {0}")]
pub struct DecodeError(pub String);

impl Envelope {
    /// Decodes a message: the relay's native headers (`event-id` and `event-type` required), or
    /// a CloudEvents 1.0 message in binary or structured mode (`id` and `type` required; see
    /// the module docs of `cloudevents`). `headers` are kept as received; for a structured
    /// CloudEvent, `payload` becomes the event's data.
    pub fn decode(
        destination: impl Into<String>,
        headers: BTreeMap<String, String>,
        payload: Bytes,
    ) -> Result<Self, DecodeError> {
        let (fields, payload) = match cloudevents::to_native(&headers, &payload) {
            None => (Fields::parse(&headers)?, payload),
            Some(native) => {
                let native = native?;
                let mut fields = Fields::parse(&native.headers)?;
                let source = native
                    .source
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| DecodeError("CloudEvent without source".into()))?;
                fields.key_by_source(&source);
                (fields, native.payload)
            }
        };
        Ok(Self {
            event_id: fields.event_id,
            message_id: fields.message_id,
            event_type: fields.event_type,
            schema_version: fields.schema_version,
            aggregate_type: fields.aggregate_type,
            aggregate_id: fields.aggregate_id,
            aggregate_version: fields.aggregate_version,
            occurred_at: fields.occurred_at,
            copy_of_schema_version: copy_marker(&headers)?,
            destination: destination.into(),
            headers,
            payload,
        })
    }

    /// A message that decodes to this envelope (to apply an envelope built by hand): its
    /// headers with the relay's native fields written over them. Its body is the payload, so a
    /// structured CloudEvent's becomes a native message (whose event id, when its `id` was a
    /// UUID, is then the UUIDv5 of its inbox key; the inbox key itself is kept).
    pub fn to_message(&self) -> crate::Message {
        let mut headers = self.headers.clone();
        let structured = headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("content-type") && crate::cloudevents::is_structured(v)
        });
        if structured {
            headers.retain(|k, _| !k.eq_ignore_ascii_case("content-type"));
        }
        let mut set = |name: &str, value: String| {
            headers.insert(name.to_owned(), value);
        };
        set(header::EVENT_ID, self.message_id.clone());
        set(header::EVENT_TYPE, self.event_type.clone());
        set(header::SCHEMA_VERSION, self.schema_version.to_string());
        if let Some(kind) = &self.aggregate_type {
            set(header::AGGREGATE_TYPE, kind.clone());
        }
        if let Some(id) = &self.aggregate_id {
            set(header::AGGREGATE_ID, id.clone());
        }
        if let Some(version) = self.aggregate_version {
            set(header::AGGREGATE_VERSION, version.to_string());
        }
        if let Some(at) = self.occurred_at {
            set(
                header::OCCURRED_AT,
                at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            );
        }
        if let Some(copy) = self.copy_of_schema_version {
            set(header::COPY_OF_SCHEMA_VERSION, copy.to_string());
        }
        crate::Message::new(self.destination.clone(), headers, self.payload.clone())
    }

    /// Parses the payload as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }
}

/// The fan-out copy marker, read from the headers as received (it travels beside CloudEvents
/// attributes too).
fn copy_marker(headers: &BTreeMap<String, String>) -> Result<Option<i32>, DecodeError> {
    let Some((_, value)) = headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(header::COPY_OF_SCHEMA_VERSION))
    else {
        return Ok(None);
    };
    value
        .parse()
        .ok()
        .filter(|v: &i32| *v >= 1)
        .map(Some)
        .ok_or_else(|| {
            DecodeError(format!(
                "{} {value:?} is not a positive integer",
                header::COPY_OF_SCHEMA_VERSION
            ))
        })
}

/// The namespace of the UUIDv5 event ids given to messages whose ids are not UUIDs.
const MESSAGE_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6f75_7462_6f78_4d49_8000_6d65_7373_6167);

impl Fields {
    /// A CloudEvent's inbox key. The spec makes `source` + `id` unique, not `id` alone: an `id`
    /// that is not a UUID (a producer's own numbering) is keyed with its source, and gets a
    /// UUIDv5 of that key as its event id. A UUID `id` is unique by construction and keyed
    /// alone, as the relay's native message of the same event is (an event the relay sends
    /// again after switching envelopes is still recognised).
    fn key_by_source(&mut self, source: &str) {
        if Uuid::parse_str(&self.message_id).is_ok() {
            return;
        }
        let key = format!("ce:{}:{source}{}", source.chars().count(), self.message_id);
        let hashed = || format!("ce:{}", Uuid::new_v5(&MESSAGE_ID_NAMESPACE, key.as_bytes()));
        let key = if key.chars().count() > outbox::MAX_MESSAGE_ID_CHARS || key.contains('\0') {
            hashed()
        } else {
            key
        };
        self.event_id = Uuid::new_v5(&MESSAGE_ID_NAMESPACE, key.as_bytes());
        self.message_id = key;
    }
}

/// The standard fields, parsed from native header names.
struct Fields {
    event_id: Uuid,
    message_id: String,
    event_type: String,
    schema_version: i32,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    aggregate_version: Option<i64>,
    occurred_at: Option<DateTime<Utc>>,
}

impl Fields {
    fn parse(headers: &BTreeMap<String, String>) -> Result<Self, DecodeError> {
        let get = |name: &str| headers.get(name).map(String::as_str);
        let raw = get(header::EVENT_ID)
            .filter(|id| !id.is_empty())
            .ok_or_else(|| DecodeError("no event-id header".into()))?;
        let (event_id, message_id) = match Uuid::parse_str(raw) {
            Ok(id) => (id, id.to_string()),
            Err(_) if raw.chars().count() > outbox::MAX_MESSAGE_ID_CHARS => {
                return Err(DecodeError(format!(
                    "event-id is longer than {} characters",
                    outbox::MAX_MESSAGE_ID_CHARS
                )))
            }
            Err(_) if raw.contains('\0') => {
                return Err(DecodeError("event-id contains NUL".into()));
            }
            Err(_) => (
                Uuid::new_v5(&MESSAGE_ID_NAMESPACE, raw.as_bytes()),
                raw.to_owned(),
            ),
        };
        let event_type = get(header::EVENT_TYPE)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| DecodeError("no event-type header".into()))?
            .to_owned();
        // The inbox records the type: one it cannot store is refused here, not retried.
        if let Err(e) = outbox::check_inbox_message(&message_id, Some(&event_type)) {
            return Err(DecodeError(format!("event-type: {e}")));
        }
        let schema_version = match get(header::SCHEMA_VERSION) {
            None => 1,
            Some(v) => v.parse().ok().filter(|v: &i32| *v >= 1).ok_or_else(|| {
                DecodeError(format!("schema-version {v:?} is not a positive integer"))
            })?,
        };
        // The largest bigint has no successor: no gate could ever wait past it.
        let aggregate_version =
            match get(header::AGGREGATE_VERSION) {
                None => None,
                Some(v) => Some(v.parse().ok().filter(|v: &i64| *v < i64::MAX).ok_or_else(
                    || {
                        DecodeError(format!(
                            "aggregate-version {v:?} is not an integer below {}",
                            i64::MAX
                        ))
                    },
                )?),
            };
        // The aggregate keys a lane, a lock and a table row: text without NUL.
        for name in [header::AGGREGATE_TYPE, header::AGGREGATE_ID] {
            if get(name).is_some_and(|v| v.contains('\0')) {
                return Err(DecodeError(format!("{name} contains NUL")));
            }
        }
        // RFC 3339, or the signed years chrono writes past 9999 and before year 1
        // (`+10000-01-01T…`), which PostgreSQL's timestamptz can hold.
        let occurred_at = get(header::OCCURRED_AT)
            .and_then(|v| {
                DateTime::parse_from_rfc3339(v)
                    .or_else(|_| v.parse::<DateTime<FixedOffset>>())
                    .ok()
            })
            .map(|t| t.with_timezone(&Utc));
        Ok(Self {
            event_id,
            message_id,
            event_type,
            schema_version,
            aggregate_type: get(header::AGGREGATE_TYPE).map(str::to_owned),
            aggregate_id: get(header::AGGREGATE_ID).map(str::to_owned),
            aggregate_version,
            occurred_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn decodes_the_relays_headers() {
        let id = Uuid::now_v7();
        let e = Envelope::decode(
            "order.Placed",
            headers(&[
                ("event-id", &id.to_string()),
                ("event-type", "Placed"),
                ("schema-version", "2"),
                ("aggregate-id", "42"),
                ("aggregate-version", "7"),
                ("occurred-at", "2026-11-30T03:00:00.000001Z"),
            ]),
            Bytes::from_static(b"{\"a\":1}"),
        )
        .unwrap();
        assert_eq!(e.event_id, id);
        assert_eq!(e.schema_version, 2);
        assert_eq!(e.aggregate_version, Some(7));
        assert!(e.occurred_at.is_some());
        assert_eq!(e.json::<serde_json::Value>().unwrap()["a"], 1);
    }

    /// A producer's id that is not a UUID is the inbox key as sent, with a stable UUIDv5 as
    /// the event id; a UUID in any case is recorded in one form.
    #[test]
    fn takes_any_text_id() {
        let decode = |id: &str| {
            Envelope::decode(
                "s",
                headers(&[("event-id", id), ("event-type", "T")]),
                Bytes::new(),
            )
            .unwrap()
        };
        let a = decode("A234-1234-1234");
        assert_eq!(a.message_id, "A234-1234-1234");
        assert_eq!(a.event_id, decode("A234-1234-1234").event_id, "stable");
        assert_ne!(a.event_id, decode("A234-1234-1235").event_id);
        let id = Uuid::now_v7();
        let upper = decode(&id.to_string().to_uppercase());
        assert_eq!((upper.event_id, upper.message_id), (id, id.to_string()));
    }

    /// What the property test found: an `occurred_at` after year 9999 (or before year 1)
    /// went out as `+10000-…`, which the strict RFC 3339 parser refused, and was dropped.
    #[test]
    fn reads_the_extended_years_the_relay_writes() {
        for text in [
            "+10000-01-01T00:00:00.000000Z",
            "-4713-11-24T00:00:00.000000Z",
        ] {
            let e = Envelope::decode(
                "s",
                headers(&[
                    ("event-id", &Uuid::now_v7().to_string()),
                    ("event-type", "T"),
                    ("occurred-at", text),
                ]),
                Bytes::new(),
            )
            .unwrap();
            let sent = e.occurred_at.expect(text);
            assert_eq!(
                sent.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                text
            );
        }
    }

    #[test]
    fn says_what_is_malformed() {
        let cases = [
            (headers(&[]), "no event-id header"),
            (
                headers(&[("event-id", &"x".repeat(256)), ("event-type", "T")]),
                "event-id is longer than 255 characters",
            ),
            (
                headers(&[("event-id", ""), ("event-type", "T")]),
                "no event-id header",
            ),
            (
                headers(&[("event-id", &Uuid::now_v7().to_string())]),
                "no event-type header",
            ),
            (
                headers(&[
                    ("event-id", &Uuid::now_v7().to_string()),
                    ("event-type", "T"),
                    ("schema-version", "0"),
                ]),
                "schema-version \"0\"",
            ),
        ];
        for (h, expected) in cases {
            let err = Envelope::decode("s", h, Bytes::new())
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{err} vs {expected}");
        }
    }
}
