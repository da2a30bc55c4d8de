//! Outbox rows with any column content, as other languages may INSERT them, through
//! `ClaimedRow::decode`: it never panics; it yields a message carrying the row unchanged (and
//! that the consumer decodes back), or a permanent error that starts with the bad column's name.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use chrono::{DateTime, SubsecRound};
use libfuzzer_sys::fuzz_target;
use outbox_consumer::Envelope;
use outbox_relayer::{routing::RoutingConfig, store::ClaimedRow};
use serde_json::Value;
use uuid::Uuid;

/// Any JSON value (the `headers` column is jsonb of any shape).
#[derive(Arbitrary, Debug)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn value(&self) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Int(i) => Value::from(*i),
            Json::Float(f) => Value::from(*f),
            Json::Text(s) => Value::String(s.clone()),
            Json::Array(a) => Value::Array(a.iter().map(Json::value).collect()),
            Json::Object(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), v.value())).collect())
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Row {
    id: i64,
    event_id: u128,
    aggregate_type: String,
    aggregate_id: String,
    aggregate_version: Option<i64>,
    event_type: String,
    schema_version: i32,
    destination: Option<String>,
    payload: Vec<u8>,
    limit: u16,
    content_type: String,
    /// Either a map of strings (the common case) or any JSON.
    headers: Result<Vec<(String, String)>, Json>,
    occurred_at_micros: i64,
    partition: i32,
    attempts: i32,
}

const COLUMNS: &[&str] = &[
    "payload",
    "headers",
    "header",
    "content_type",
    "schema_version",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "destination",
    "occurred_at",
];

fuzz_target!(|input: Row| {
    let limit = usize::from(input.limit);
    let size = input.payload.len();
    let headers = match &input.headers {
        Ok(pairs) => Value::Object(
            pairs
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        ),
        Err(json) => json.value(),
    };
    let row = ClaimedRow {
        id: input.id,
        event_id: Uuid::from_u128(input.event_id),
        aggregate_type: input.aggregate_type,
        aggregate_id: input.aggregate_id,
        aggregate_version: input.aggregate_version,
        event_type: input.event_type,
        schema_version: input.schema_version,
        destination: input.destination,
        // As the claim reads it: over the limit, the payload is not loaded.
        payload: (size <= limit).then_some(input.payload),
        payload_size: size as i64,
        content_type: input.content_type,
        headers,
        // Out of chrono's range, as the claim reads ±infinity: None.
        occurred_at: DateTime::from_timestamp_micros(input.occurred_at_micros),
        partition: input.partition,
        attempts: input.attempts,
    };
    let routing = RoutingConfig::default();
    let m = match row.decode(&routing, limit) {
        Ok(m) => m,
        Err(e) => {
            assert!(!e.is_transient(), "{e}");
            assert!(
                COLUMNS.iter().any(|c| e.message.starts_with(c)),
                "{}",
                e.message
            );
            return;
        }
    };
    assert_eq!(Some(&m.payload[..]), row.payload.as_deref());
    let stored: BTreeMap<String, String> = row
        .headers
        .as_object()
        .expect("decoded headers come from an object")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().expect("strings").to_owned()))
        .collect();
    assert_eq!(m.headers, stored);
    assert_eq!(
        (m.id, m.event_id, m.attempts),
        (row.id, row.event_id, row.attempts)
    );
    assert_eq!(
        (&m.aggregate_type, &m.aggregate_id),
        (&row.aggregate_type, &row.aggregate_id)
    );
    assert_eq!(
        (&m.event_type, m.schema_version),
        (&row.event_type, row.schema_version)
    );
    assert_eq!(m.aggregate_version, row.aggregate_version);
    assert_eq!(m.content_type, row.content_type);

    // What the publishers send, the consumer decodes back.
    let sent: BTreeMap<String, String> = m.broker_headers().into_iter().collect();
    let e = Envelope::decode(m.destination.clone(), sent.clone(), m.payload.clone())
        .unwrap_or_else(|e| panic!("{e} for {sent:?}"));
    assert_eq!(e.event_id, m.event_id);
    assert_eq!(e.event_type, m.event_type);
    assert_eq!(e.schema_version, m.schema_version);
    assert_eq!(e.aggregate_type.as_deref(), Some(m.aggregate_type.as_str()));
    assert_eq!(e.aggregate_id.as_deref(), Some(m.aggregate_id.as_str()));
    assert_eq!(e.aggregate_version, m.aggregate_version);
    assert_eq!(e.occurred_at, Some(m.occurred_at.trunc_subsecs(6)));
    assert_eq!(e.headers, sent);
    assert_eq!(e.payload, m.payload);
});
