//! Properties of `ClaimedRow::decode` on rows with any column content (rows written by other
//! languages): it never panics; it either yields a message whose body is the payload, byte for
//! byte, and whose fields and headers are the row's, or a permanent error whose message starts
//! with the name of a column that is really wrong.

use std::collections::BTreeMap;

use chrono::DateTime;
use outbox_relayer::{routing::RoutingConfig, store::ClaimedRow};
use proptest::prelude::*;
use serde_json::Value;
use uuid::Uuid;

/// Payloads over this are not loaded by the claim (`payload` is NULL).
const LIMIT: usize = 64;

/// Text columns: mostly well-formed, sometimes blank, control characters or anything.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[A-Za-z0-9._/-]{1,16}",
        1 => "[ \t]{0,3}",
        1 => "[a-z]{0,3}[\r\n\u{0}\u{1}\u{7f}\u{85}][a-z]{0,3}",
        1 => "\\PC{1,8}",
        1 => any::<String>(),
    ]
}

/// Header names: the allowed alphabet, or anything.
fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![4 => "[A-Za-z0-9._-]{1,12}", 1 => any::<String>()]
}

/// Any JSON value, small.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(header_name(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// The `headers` column: mostly an object of strings, else any JSON.
fn headers() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => prop::collection::btree_map(header_name(), text(), 0..5)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k, Value::String(v))).collect())),
        1 => json(),
    ]
}

prop_compose! {
    fn row()(
        (id, event_id, aggregate_type, aggregate_id, aggregate_version) in
            (any::<i64>(), any::<u128>(), text(), text(), any::<Option<i64>>()),
        (event_type, schema_version, destination) in
            (text(), prop_oneof![4 => 1..5i32, 1 => any::<i32>()], prop::option::of(text())),
        payload in prop::collection::vec(any::<u8>(), 0..LIMIT * 2),
        (content_type, headers, micros, partition, attempts) in (
            text(),
            headers(),
            // Out of chrono's range (as ±infinity reads): None.
            prop_oneof![4 => 0..4_102_444_800_000_000i64, 1 => any::<i64>()],
            any::<i32>(),
            any::<i32>(),
        ),
    ) -> ClaimedRow {
        let size = payload.len();
        ClaimedRow {
            id,
            event_id: Uuid::from_u128(event_id),
            aggregate_type,
            aggregate_id,
            aggregate_version,
            event_type,
            schema_version,
            destination,
            // As the claim reads it: over the limit, the payload is not loaded.
            payload: (size <= LIMIT).then_some(payload.into()),
            payload_size: size as i64,
            content_type,
            headers: headers.to_string(),
            unreadable: None,
            occurred_at: DateTime::from_timestamp_micros(micros),
            partition,
            attempts,
            permanent_failures: 0,
            row_bytes: 0,
        }
    }
}

/// The columns a reader of the column contract would call malformed.
fn problems(row: &ClaimedRow) -> Vec<&'static str> {
    let printable = |s: &str| !s.trim().is_empty() && !s.chars().any(char::is_control);
    let mut out = Vec::new();
    if row.payload.is_none() {
        out.push("payload");
    }
    match &serde_json::from_str::<Value>(&row.headers).expect("generated JSON") {
        Value::Object(map) => {
            let ok = map.iter().all(|(name, value)| {
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                    && value
                        .as_str()
                        .is_some_and(|v| !v.contains(['\r', '\n', '\0']))
            });
            if !ok {
                out.push("header");
            }
        }
        _ => out.push("headers"),
    }
    if !printable(&row.content_type) {
        out.push("content_type");
    }
    if row.schema_version < 1 {
        out.push("schema_version");
    }
    if row.occurred_at.is_none() {
        out.push("occurred_at");
    }
    for (column, value) in [
        ("aggregate_type", &row.aggregate_type),
        ("aggregate_id", &row.aggregate_id),
        ("event_type", &row.event_type),
    ] {
        if !printable(value) {
            out.push(column);
        }
    }
    if row.destination.as_deref().is_some_and(|d| !printable(d)) {
        out.push("destination");
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn decode_yields_the_row_unchanged_or_a_permanent_error_naming_the_column(row in row()) {
        let routing = RoutingConfig::default();
        let expected = problems(&row);
        match row.decode(&routing, LIMIT) {
            Ok(m) => {
                prop_assert!(expected.is_empty(), "decoded a row with problems {expected:?}");
                prop_assert_eq!(&m.payload[..], &row.payload.clone().unwrap()[..]);
                let headers: BTreeMap<String, String> =
                    serde_json::from_str::<Value>(&row.headers)
                    .unwrap()
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect();
                prop_assert_eq!(&m.headers, &headers);
                prop_assert_eq!(m.id, row.id);
                prop_assert_eq!(m.event_id, row.event_id);
                prop_assert_eq!(&m.aggregate_type, &row.aggregate_type);
                prop_assert_eq!(&m.aggregate_id, &row.aggregate_id);
                prop_assert_eq!(m.aggregate_version, row.aggregate_version);
                prop_assert_eq!(&m.event_type, &row.event_type);
                prop_assert_eq!(m.schema_version, row.schema_version);
                prop_assert_eq!(&m.content_type, &row.content_type);
                prop_assert_eq!(Some(m.occurred_at), row.occurred_at);
                prop_assert_eq!(m.attempts, row.attempts);
                let routed = routing.route(
                    row.destination.as_deref(),
                    &row.aggregate_type,
                    &row.event_type,
                    row.schema_version,
                );
                prop_assert_eq!(m.destination, routed);
            }
            Err(e) => {
                prop_assert!(!e.is_transient(), "a malformed row is a permanent error: {e}");
                prop_assert!(
                    expected.iter().any(|column| e.message.starts_with(column)),
                    "{:?} should start with one of {expected:?}", e.message
                );
            }
        }
    }
}

fn good_row() -> ClaimedRow {
    ClaimedRow {
        id: 1,
        event_id: Uuid::now_v7(),
        aggregate_type: "order".into(),
        aggregate_id: "42".into(),
        aggregate_version: None,
        event_type: "Placed".into(),
        schema_version: 1,
        destination: None,
        payload: Some(bytes::Bytes::from_static(b"{}")),
        payload_size: 2,
        content_type: "application/json".into(),
        headers: "{}".into(),
        unreadable: None,
        occurred_at: Some(chrono::Utc::now()),
        partition: 0,
        attempts: 0,
        permanent_failures: 0,
        row_bytes: 2,
    }
}

/// The bug the property found: the key and type columns go into broker headers (and NATS
/// subjects) unchecked, so a CR/LF written by plain SQL reached the broker protocol.
#[test]
fn control_characters_in_key_and_type_columns_are_permanent_errors_naming_the_column() {
    type Spoil = fn(&mut ClaimedRow);
    let cases: [(Spoil, &str); 6] = [
        (
            |r| r.aggregate_id = "42\r\nNats-Msg-Id: forged".into(),
            "aggregate_id",
        ),
        (|r| r.aggregate_type = "order\n".into(), "aggregate_type"),
        (|r| r.event_type = " ".into(), "event_type"),
        (|r| r.occurred_at = None, "occurred_at"),
        (|r| r.destination = Some("".into()), "destination"),
        (|r| r.destination = Some("a.b\u{7}".into()), "destination"),
    ];
    for (spoil, column) in cases {
        let mut row = good_row();
        spoil(&mut row);
        let err = row.decode(&RoutingConfig::default(), 10).unwrap_err();
        assert!(!err.is_transient());
        assert!(
            err.message.starts_with(column),
            "{} vs {column}",
            err.message
        );
    }
    assert!(good_row().decode(&RoutingConfig::default(), 10).is_ok());
}
