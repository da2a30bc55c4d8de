//! Broker messages reaching the consumer runners: `Envelope::decode` of any destination,
//! headers and payload never panics, refuses with the header's name, and what it accepts is
//! consistent with the headers it was given.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use outbox_consumer::Envelope;
use uuid::Uuid;

/// Header names: the relay's, or any.
#[derive(Arbitrary, Debug)]
enum Name {
    EventId,
    EventType,
    SchemaVersion,
    AggregateType,
    AggregateId,
    AggregateVersion,
    OccurredAt,
    ContentType,
    Other(String),
}

impl Name {
    fn text(self) -> String {
        match self {
            Name::EventId => "event-id".into(),
            Name::EventType => "event-type".into(),
            Name::SchemaVersion => "schema-version".into(),
            Name::AggregateType => "aggregate-type".into(),
            Name::AggregateId => "aggregate-id".into(),
            Name::AggregateVersion => "aggregate-version".into(),
            Name::OccurredAt => "occurred-at".into(),
            Name::ContentType => "content-type".into(),
            Name::Other(s) => s,
        }
    }
}

/// Header values: a valid UUID (so that decoding gets past `event-id`), or any text.
#[derive(Arbitrary, Debug)]
enum Text {
    Uuid(u128),
    Any(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    destination: String,
    headers: Vec<(Name, Text)>,
    payload: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let headers: BTreeMap<String, String> = input
        .headers
        .into_iter()
        .map(|(name, value)| {
            let value = match value {
                Text::Uuid(u) => Uuid::from_u128(u).to_string(),
                Text::Any(s) => s,
            };
            (name.text(), value)
        })
        .collect();
    let payload = Bytes::from(input.payload);
    match Envelope::decode(input.destination.clone(), headers.clone(), payload.clone()) {
        Ok(e) => {
            let id = Uuid::parse_str(&headers["event-id"]).expect("accepted ids parse");
            assert_eq!(e.event_id, id);
            assert_eq!(Some(&e.event_type), headers.get("event-type"));
            assert!(!e.event_type.is_empty() && e.schema_version >= 1);
            assert_eq!(e.aggregate_id.as_ref(), headers.get("aggregate-id"));
            assert_eq!(e.aggregate_type.as_ref(), headers.get("aggregate-type"));
            assert_eq!(e.destination, input.destination);
            assert_eq!(e.headers, headers);
            assert_eq!(e.payload, payload);
        }
        Err(err) => {
            let text = err.to_string();
            assert!(
                [
                    "event-id",
                    "event-type",
                    "schema-version",
                    "aggregate-version",
                    "occurred-at"
                ]
                .iter()
                .any(|h| text.contains(h)),
                "{text}"
            );
        }
    }
});
