//! Properties of `Envelope::decode` (broker input reaching the consumer runners): it never
//! panics, says which header is wrong when it refuses a message, and gives back everything the
//! relay's publishers send (`Message::broker_headers`, `Message::visit_headers`).

use std::collections::BTreeMap;

use bytes::Bytes;
use chrono::{DateTime, SubsecRound, Utc};
use outbox_consumer::Envelope;
use outbox_relayer::{routing::RoutingConfig, store::ClaimedRow, Message};
use proptest::prelude::*;
use uuid::Uuid;

/// Printable column text, as `ClaimedRow::decode` accepts it.
fn column() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[A-Za-z0-9._-]{1,16}", 1 => "[^\\p{C}]{0,6}[A-Za-z][^\\p{C}]{0,6}"]
}

/// Header values: anything but CR, LF and NUL.
fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[ -~]{0,20}", 1 => "[^\r\n\u{0}]{0,10}"]
}

/// `occurred_at` over chrono's range, which holds PostgreSQL's `timestamptz` (4713 BC to
/// 294276 AD) up to 262142 AD.
fn instant() -> impl Strategy<Value = DateTime<Utc>> {
    prop_oneof![
        3 => 0i64..4_102_444_800_000_000,
        1 => -210_866_803_200_000_000i64..=i64::MAX,
    ]
    .prop_filter_map("in chrono's range", DateTime::from_timestamp_micros)
}

prop_compose! {
    /// A message as the relay builds it: a well-formed row, decoded.
    fn message()(
        (event_id, aggregate_type, aggregate_id, aggregate_version) in
            (any::<u128>(), column(), column(), prop::option::of(0..=i64::MAX)),
        (event_type, schema_version, content_type) in (column(), 1..=i32::MAX, column()),
        payload in prop::collection::vec(any::<u8>(), 0..64),
        headers in prop::collection::btree_map("[A-Za-z0-9._-]{1,16}", header_value(), 0..5),
        occurred_at in instant(),
    ) -> Message {
        let row = ClaimedRow {
            id: 1,
            event_id: Uuid::from_u128(event_id),
            aggregate_type,
            aggregate_id,
            aggregate_version,
            event_type,
            schema_version,
            destination: None,
            payload_size: payload.len() as i64,
            payload: Some(payload.into()),
            content_type,
            headers: serde_json::to_string(&headers).unwrap(),
            unreadable: None,
            occurred_at: Some(occurred_at),
            partition: 0,
            attempts: 0,
            permanent_failures: 0,
            row_bytes: 0,
        };
        row.decode(&RoutingConfig::default(), 1024).expect("a well-formed row")
    }
}

/// Headers a consumer might receive: the relay's names with any value, and others.
fn received_headers() -> impl Strategy<Value = BTreeMap<String, String>> {
    let name = prop_oneof![
        3 => prop::sample::select(vec![
            "event-id", "event-type", "schema-version", "aggregate-type", "aggregate-id",
            "aggregate-version", "occurred-at", "content-type",
        ]).prop_map(str::to_owned),
        1 => any::<String>(),
    ];
    let value = prop_oneof![
        1 => any::<u128>().prop_map(|u| Uuid::from_u128(u).to_string()),
        1 => any::<i64>().prop_map(|v| v.to_string()),
        1 => Just("2026-11-30T03:00:00.000001Z".to_owned()),
        2 => any::<String>(),
    ];
    prop::collection::btree_map(name, value, 0..9)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn decodes_everything_the_relay_sends(m in message()) {
        let sent: BTreeMap<String, String> = m.broker_headers().into_iter().collect();
        let mut visited = BTreeMap::new();
        m.visit_headers(|k, v| { visited.insert(k.to_owned(), v.to_owned()); });
        prop_assert_eq!(&visited, &sent, "the NATS path sends the same headers");

        let e = Envelope::decode(m.destination.clone(), sent.clone(), m.payload.clone())
            .map_err(|e| TestCaseError::fail(format!("{e} for {sent:?}")))?;
        prop_assert_eq!(e.event_id, m.event_id);
        prop_assert_eq!(&e.message_id, &m.event_id.to_string());
        prop_assert_eq!(&e.event_type, &m.event_type);
        prop_assert_eq!(e.schema_version, m.schema_version);
        prop_assert_eq!(e.aggregate_type.as_ref(), Some(&m.aggregate_type));
        prop_assert_eq!(e.aggregate_id.as_ref(), Some(&m.aggregate_id));
        prop_assert_eq!(e.aggregate_version, m.aggregate_version);
        prop_assert_eq!(e.occurred_at, Some(m.occurred_at.trunc_subsecs(6)));
        prop_assert_eq!(&e.destination, &m.destination);
        prop_assert_eq!(&e.headers, &sent);
        prop_assert_eq!(&e.payload, &m.payload);
        // The writer's headers travel, except those named like the relay's own or like
        // CloudEvents attributes, in any case.
        let reserved = |n: &str| {
            let lower = n.to_ascii_lowercase();
            STANDARD.contains(&lower.as_str())
                || ["ce-", "ce_", "cloudevents:", "cloudevents_"]
                    .iter()
                    .any(|p| lower.starts_with(p))
        };
        for (name, value) in m.headers.iter().filter(|(n, _)| !reserved(n)) {
            prop_assert_eq!(e.headers.get(name), Some(value));
        }
    }

    #[test]
    fn decode_never_panics_and_names_the_bad_header(
        headers in received_headers(),
        payload in prop::collection::vec(any::<u8>(), 0..32),
    ) {
        match Envelope::decode("s", headers.clone(), Bytes::from(payload)) {
            Ok(e) => {
                // A UUID in its lowercase form; any other text as sent.
                let sent = headers.get("event-id").map(|v| {
                    Uuid::parse_str(v).map(|u| u.to_string()).unwrap_or_else(|_| v.clone())
                });
                prop_assert_eq!(Some(e.message_id.clone()), sent);
                prop_assert!(!e.event_type.is_empty());
                prop_assert!(e.schema_version >= 1);
                prop_assert_eq!(e.headers, headers);
            }
            Err(err) => {
                let text = err.to_string();
                prop_assert!(
                    ["event-id", "event-type", "schema-version", "aggregate-version",
                     "copy-of-schema-version"]
                        .iter()
                        .any(|h| text.contains(h)),
                    "{text:?} should name the header"
                );
            }
        }
    }
}

const STANDARD: &[&str] = &[
    "event-id",
    "event-type",
    "schema-version",
    "aggregate-type",
    "aggregate-id",
    "aggregate-version",
    "occurred-at",
    "content-type",
];
