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
    /// it ([`crate::fanout::copy_message_id`]).
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
    /// Calls `f` for every header to put on the broker message, without building a map: the
    /// writer's headers (except those the relay sets), then the relay's standard ones.
    pub fn visit_headers(&self, mut f: impl FnMut(&str, &str)) {
        if !self.native_headers {
            for (name, value) in &self.headers {
                f(name, value);
            }
            return;
        }
        const STANDARD: &[&str] = &[
            header::EVENT_ID,
            header::EVENT_TYPE,
            header::SCHEMA_VERSION,
            header::AGGREGATE_TYPE,
            header::AGGREGATE_ID,
            header::AGGREGATE_VERSION,
            header::OCCURRED_AT,
            header::CONTENT_TYPE,
        ];
        for (name, value) in &self.headers {
            if !STANDARD.contains(&name.as_str()) {
                f(name, value);
            }
        }
        f(header::EVENT_ID, &self.event_id.to_string());
        f(header::EVENT_TYPE, &self.event_type);
        f(header::SCHEMA_VERSION, &self.schema_version.to_string());
        f(header::AGGREGATE_TYPE, &self.aggregate_type);
        f(header::AGGREGATE_ID, &self.aggregate_id);
        if let Some(v) = self.aggregate_version {
            f(header::AGGREGATE_VERSION, &v.to_string());
        }
        f(
            header::OCCURRED_AT,
            &self
                .occurred_at
                .to_rfc3339_opts(SecondsFormat::Micros, true),
        );
        f(header::CONTENT_TYPE, &self.content_type);
    }

    /// All headers to put on the broker message: the writer's, then the relay's standard ones
    /// (which win on a name clash).
    pub fn broker_headers(&self) -> Vec<(String, String)> {
        if !self.native_headers {
            return self.headers.clone().into_iter().collect();
        }
        let mut out: BTreeMap<String, String> = self.headers.clone();
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
    fn standard_headers_win_over_user_headers() {
        let m = super::sample(7, "a1");
        let headers: std::collections::HashMap<_, _> = m.broker_headers().into_iter().collect();
        assert_eq!(headers["event-id"], m.event_id.to_string());
        assert_eq!(headers["traceparent"], "00-abc-def-01");
        assert_eq!(headers["schema-version"], "2");
        assert_eq!(headers["aggregate-version"], "7");
    }
}
