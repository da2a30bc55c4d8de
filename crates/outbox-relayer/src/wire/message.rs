//! The message a publisher sends: one outbox row, decoded and routed.

use std::collections::BTreeMap;

use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use uuid::Uuid;

/// Header names the relay sets on every message (the wire contract, [`outbox::wire`]).
pub use outbox::wire::header;

/// One event on its way to the broker.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Internal row id in the outbox table.
    pub id: i64,
    /// The event id: the `event-id` header, the consumers' idempotency key.
    pub event_id: Uuid,
    /// The broker's message id and dedupe key (`Nats-Msg-Id`, AMQP `message-id`, …): the
    /// event id, except on a fan-out copy, which needs an id of its own for the broker to keep
    /// it ([`crate::wire::fanout::copy_message_id`]).
    pub message_id: Uuid,
    /// Ordering key, first half.
    pub aggregate_type: String,
    /// Ordering key, second half; the broker partition key.
    pub aggregate_id: String,
    /// The writer's per-aggregate sequence, if any.
    pub aggregate_version: Option<i64>,
    /// The event type.
    pub event_type: String,
    /// The payload's schema version.
    pub schema_version: i32,
    /// Where to publish: topic, subject or routing key, already resolved by the router.
    pub destination: String,
    /// The payload bytes, unchanged from the row.
    pub payload: Bytes,
    /// The payload's content type.
    pub content_type: String,
    /// The writer's headers (trace context, correlation id, …).
    pub headers: BTreeMap<String, String>,
    /// When the event was written.
    pub occurred_at: DateTime<Utc>,
    /// Publish attempts made before this one.
    pub attempts: i32,
    /// Whether the relay's native headers ([`header`]) go on the wire with `headers`. `false`
    /// when an envelope (CloudEvents) already put its own attributes in `headers`.
    pub native_headers: bool,
}

impl Message {
    /// Calls `f` for every header to put on the broker message, without building a map and
    /// without allocating: the writer's headers (except those the relay sets, in any case),
    /// then the relay's standard ones, their values formatted on the stack. Each relay header
    /// name is visited once, with the relay's value.
    pub fn visit_headers(&self, mut f: impl FnMut(&str, &str)) {
        if !self.native_headers {
            for (name, value) in &self.headers {
                f(name, value);
            }
            return;
        }
        for (name, value) in &self.headers {
            if self.may_carry_writer_header(name) {
                f(name, value);
            }
        }
        let mut id = [0u8; uuid::fmt::Hyphenated::LENGTH];
        f(
            header::EVENT_ID,
            self.event_id.hyphenated().encode_lower(&mut id),
        );
        f(header::EVENT_TYPE, &self.event_type);
        let mut n = Digits::default();
        f(header::SCHEMA_VERSION, n.of(i64::from(self.schema_version)));
        f(header::AGGREGATE_TYPE, &self.aggregate_type);
        f(header::AGGREGATE_ID, &self.aggregate_id);
        if let Some(v) = self.aggregate_version {
            f(header::AGGREGATE_VERSION, n.of(v));
        }
        let mut time = Rfc3339::default();
        f(header::OCCURRED_AT, time.of(&self.occurred_at));
        f(header::CONTENT_TYPE, &self.content_type);
    }

    /// Whether this message is a fan-out copy (its broker message id is its own, not the
    /// event's).
    pub fn is_copy(&self) -> bool {
        self.message_id != self.event_id
    }

    /// Whether the writer's header `name` may travel on this message: the copy marker only on
    /// a copy (a writer cannot make its event look like one).
    pub(crate) fn may_carry(&self, name: &str) -> bool {
        self.is_copy() || !name.eq_ignore_ascii_case(header::COPY_OF_SCHEMA_VERSION)
    }

    /// Whether the writer's header `name` travels beside the relay's native headers: not one
    /// the relay sets itself, in any case (`Event-Id` would reach a consumer that reads header
    /// names case-insensitively ahead of the real `event-id`), and the copy marker only on a
    /// copy.
    pub(crate) fn may_carry_writer_header(&self, name: &str) -> bool {
        !is_relay_header(name) && self.may_carry(name)
    }

    /// All headers to put on the broker message: the writer's (but those the relay sets, in
    /// any case), then the relay's standard ones. The same headers as [`Self::visit_headers`],
    /// sorted by name.
    pub fn broker_headers(&self) -> Vec<(String, String)> {
        if !self.native_headers {
            return self.headers.clone().into_iter().collect();
        }
        let mut out: BTreeMap<String, String> = self.headers.clone();
        out.retain(|name, _| self.may_carry_writer_header(name));
        out.insert(header::EVENT_ID.into(), self.event_id.to_string());
        out.insert(header::EVENT_TYPE.into(), self.event_type.clone());
        out.insert(
            header::SCHEMA_VERSION.into(),
            self.schema_version.to_string(),
        );
        out.insert(header::AGGREGATE_TYPE.into(), self.aggregate_type.clone());
        out.insert(header::AGGREGATE_ID.into(), self.aggregate_id.clone());
        if let Some(v) = self.aggregate_version {
            out.insert(header::AGGREGATE_VERSION.into(), v.to_string());
        }
        out.insert(
            header::OCCURRED_AT.into(),
            self.occurred_at
                .to_rfc3339_opts(SecondsFormat::Micros, true),
        );
        out.insert(header::CONTENT_TYPE.into(), self.content_type.clone());
        out.into_iter().collect()
    }
}

/// Whether a writer's header `name` would be read as the relay's: one of the native header
/// names ([`header::ALL`]), or a CloudEvents binary attribute (`ce-…`, `ce_…`), which a
/// consumer reads as the event's id, type, subject and version in place of the native ones.
/// ASCII case is ignored (brokers and consumers differ on whether names are case-sensitive).
pub(crate) fn is_relay_header(name: &str) -> bool {
    header::ALL.iter().any(|h| h.eq_ignore_ascii_case(name))
        || outbox::wire::cloudevents::BINARY_PREFIXES
            .iter()
            .any(|prefix| {
                name.get(..prefix.len())
                    .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
            })
}

/// A decimal integer formatted on the stack.
#[derive(Default)]
struct Digits {
    buf: [u8; 20],
}

impl Digits {
    /// `n` in decimal, as `i64::to_string` writes it.
    fn of(&mut self, n: i64) -> &str {
        let mut at = self.buf.len();
        let mut rest = n.unsigned_abs();
        loop {
            at -= 1;
            self.buf[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        if n < 0 {
            at -= 1;
            self.buf[at] = b'-';
        }
        std::str::from_utf8(&self.buf[at..]).expect("ASCII digits")
    }
}

/// An instant in RFC 3339 with microseconds and `Z`, formatted on the stack (what
/// `to_rfc3339_opts(SecondsFormat::Micros, true)` writes, without its allocation).
#[derive(Default)]
struct Rfc3339 {
    buf: [u8; 27],
    /// Years outside 0000–9999 and leap seconds, which chrono writes its own way.
    other: String,
}

impl Rfc3339 {
    fn of(&mut self, t: &DateTime<Utc>) -> &str {
        use chrono::{Datelike, Timelike};
        let nanos = t.nanosecond();
        if !(0..=9999).contains(&t.year()) || nanos >= 1_000_000_000 {
            self.other = t.to_rfc3339_opts(SecondsFormat::Micros, true);
            return &self.other;
        }
        let fields = [
            (0, 4, t.year() as u32),
            (5, 2, t.month()),
            (8, 2, t.day()),
            (11, 2, t.hour()),
            (14, 2, t.minute()),
            (17, 2, t.second()),
            (20, 6, nanos / 1000),
        ];
        self.buf.copy_from_slice(b"0000-00-00T00:00:00.000000Z");
        for (at, width, mut value) in fields {
            for i in (at..at + width).rev() {
                self.buf[i] = b'0' + (value % 10) as u8;
                value /= 10;
            }
        }
        std::str::from_utf8(&self.buf).expect("ASCII digits")
    }
}

#[cfg(test)]
pub(crate) fn sample(id: i64, aggregate_id: &str) -> Message {
    let event_id = Uuid::now_v7();
    Message {
        id,
        event_id,
        message_id: event_id,
        aggregate_type: "order".into(),
        aggregate_id: aggregate_id.into(),
        aggregate_version: Some(id),
        event_type: "OrderPlaced".into(),
        schema_version: 2,
        destination: "order.OrderPlaced".into(),
        payload: Bytes::from_static(b"{}"),
        content_type: "application/json".into(),
        headers: BTreeMap::from([
            ("traceparent".to_owned(), "00-abc-def-01".to_owned()),
            ("event-id".to_owned(), "forged".to_owned()),
        ]),
        occurred_at: Utc::now(),
        attempts: 0,
        native_headers: true,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn visiting_gives_the_same_headers_as_the_list() {
        let m = super::sample(7, "a1");
        let mut visited = Vec::new();
        m.visit_headers(|k, v| visited.push((k.to_owned(), v.to_owned())));
        visited.sort();
        assert_eq!(visited, m.broker_headers());
    }

    #[test]
    fn stack_formatting_writes_what_the_standard_library_and_chrono_write() {
        for n in [0, 7, -7, 10, 99, i64::MAX, i64::MIN, 1_000_000] {
            assert_eq!(super::Digits::default().of(n), n.to_string());
        }
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..10_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Any instant from year 0 to 12000, any nanosecond.
            let secs = (seed % 440_000_000_000) as i64 - 62_167_219_200;
            let t = chrono::DateTime::from_timestamp(secs, (seed >> 20) as u32 % 1_000_000_000)
                .unwrap();
            assert_eq!(
                super::Rfc3339::default().of(&t),
                t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            );
        }
    }

    /// A writer's header named like a relay header, in any case, never travels: each relay
    /// header is on the message once, with the relay's value, in both views.
    #[test]
    fn writer_headers_named_like_relay_headers_are_dropped_in_any_case() {
        let mut m = super::sample(7, "a1");
        for (name, value) in [
            ("Event-Id", "forged"),
            ("EVENT-TYPE", "Forged"),
            ("Aggregate-Id", "victim"),
            ("aggregate-ID", "victim"),
            ("Content-Type", "text/forged"),
            ("Copy-Of-Schema-Version", "9"),
            ("ce-id", "forged"),
            ("CE_type", "Forged"),
            ("ce-specversion", "1.0"),
            ("x-tenant", "t1"),
        ] {
            m.headers.insert(name.into(), value.into());
        }
        let mut visited = Vec::new();
        m.visit_headers(|k, v| visited.push((k.to_owned(), v.to_owned())));
        visited.sort();
        assert_eq!(visited, m.broker_headers(), "both views agree");
        for relay in super::header::ALL {
            let same: Vec<_> = visited
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(relay))
                .collect();
            assert_eq!(same.len(), 1, "{relay}: {same:?}");
        }
        let value = |name: &str| {
            visited
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(value("event-id"), Some(m.event_id.to_string().as_str()));
        assert_eq!(value("event-type"), Some("OrderPlaced"));
        assert_eq!(value("aggregate-id"), Some("a1"));
        assert_eq!(value("content-type"), Some("application/json"));
        assert_eq!(value("copy-of-schema-version"), None);
        assert!(
            visited
                .iter()
                .all(|(k, _)| !k.to_ascii_lowercase().starts_with("ce")),
            "no CloudEvents attribute from a writer: {visited:?}"
        );
        assert_eq!(value("x-tenant"), Some("t1"));
    }

    #[test]
    fn standard_headers_win_over_user_headers() {
        let m = super::sample(7, "a1");
        let headers: std::collections::HashMap<_, _> = m.broker_headers().into_iter().collect();
        assert_eq!(headers["event-id"], m.event_id.to_string());
        assert_eq!(headers["traceparent"], "00-abc-def-01");
        assert_eq!(headers["schema-version"], "2");
        assert_eq!(headers["aggregate-version"], "7");
    }
}
