use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{error::Error, headers::Headers};

/// Content type used when the payload is set with [`Event::json`] or left unset.
pub const DEFAULT_CONTENT_TYPE: &str = "application/json";

/// Largest payload [`crate::postgres::PgOutbox`] accepts unless configured otherwise: 1 MiB, the
/// default message limit of NATS and a safe size for every supported broker.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// Longest accepted aggregate type, event type, destination or header name, in bytes.
const MAX_NAME_BYTES: usize = 255;
/// Longest accepted header value, in bytes.
const MAX_VALUE_BYTES: usize = 4096;
/// Longest accepted aggregate id, in bytes: with the aggregate type, the key must fit in one
/// PostgreSQL index entry (about 2.7 kB), or the database refuses the row.
const MAX_AGGREGATE_ID_BYTES: usize = 2048;

/// A domain event to write into the outbox.
///
/// The ordering key is (`aggregate_type`, `aggregate_id`): the relay publishes the events of one
/// aggregate in the order they were written and never two of them at once. The `aggregate_id` is
/// also the broker's partition key. Everything else is metadata that travels with the payload.
///
/// ```
/// use outbox::Event;
/// let event = Event::new("order", "42", "OrderPlaced")
///     .json(&serde_json::json!({ "total": "19.90" }))
///     .unwrap()
///     .aggregate_version(1)
///     .header("tenant", "acme");
/// assert!(event.validate(outbox::DEFAULT_MAX_PAYLOAD_BYTES).is_ok());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) aggregate_version: Option<i64>,
    pub(crate) event_type: String,
    pub(crate) schema_version: i32,
    pub(crate) destination: Option<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) content_type: String,
    pub(crate) headers: Headers,
    pub(crate) occurred_at: Option<DateTime<Utc>>,
}

impl Event {
    /// A new event with a fresh UUIDv7 id, schema version 1 and an empty JSON object as payload.
    pub fn new(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
    ) -> Self {
        Self {
            event_id: Uuid::now_v7(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            aggregate_version: None,
            event_type: event_type.into(),
            schema_version: 1,
            destination: None,
            payload: b"{}".to_vec(),
            content_type: DEFAULT_CONTENT_TYPE.to_owned(),
            headers: Headers::new(),
            occurred_at: None,
        }
    }

    /// Serialises `value` as the JSON payload (content type `application/json`).
    pub fn json<T: serde::Serialize + ?Sized>(mut self, value: &T) -> Result<Self, Error> {
        self.payload = serde_json::to_vec(value).map_err(Error::Serialize)?;
        self.content_type = DEFAULT_CONTENT_TYPE.to_owned();
        Ok(self)
    }

    /// Sets opaque payload bytes and their content type (`application/protobuf`, …).
    pub fn payload(mut self, bytes: impl Into<Vec<u8>>, content_type: impl Into<String>) -> Self {
        self.payload = bytes.into();
        self.content_type = content_type.into();
        self
    }

    /// Replaces the generated event id (for example to derive it from a command id).
    pub fn event_id(mut self, id: Uuid) -> Self {
        self.event_id = id;
        self
    }

    /// The aggregate's own sequence number for this event. When set, the outbox rejects a second
    /// event with the same (aggregate, version): optimistic concurrency for free.
    pub fn aggregate_version(mut self, version: i64) -> Self {
        self.aggregate_version = Some(version);
        self
    }

    /// Version of the payload's schema (default 1), sent to consumers for upcasting.
    pub fn schema_version(mut self, version: i32) -> Self {
        self.schema_version = version;
        self
    }

    /// Overrides the relay's routing: the topic, subject or routing key to publish to.
    pub fn destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = Some(destination.into());
        self
    }

    /// Adds a header that travels with the message (`traceparent`, `correlation-id`, …).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Sets when the event happened; by default the database's clock at insert.
    pub fn occurred_at(mut self, at: DateTime<Utc>) -> Self {
        self.occurred_at = Some(at);
        self
    }

    /// The event's id: its idempotency key and the broker message id.
    pub fn id(&self) -> Uuid {
        self.event_id
    }

    /// The aggregate key: (`aggregate_type`, `aggregate_id`).
    pub fn aggregate(&self) -> (&str, &str) {
        (&self.aggregate_type, &self.aggregate_id)
    }

    /// The aggregate version, if one was set.
    pub fn version(&self) -> Option<i64> {
        self.aggregate_version
    }

    /// The event type.
    pub fn kind(&self) -> &str {
        &self.event_type
    }

    /// The headers set so far.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The headers as stored: [`Event::headers`], and with cargo feature `otel` the current
    /// span's trace context unless the writer set `traceparent` ([`crate::otel`]).
    pub fn stored_headers(&self) -> std::borrow::Cow<'_, Headers> {
        #[cfg(feature = "otel")]
        if let Some(traced) = crate::otel::with_current_trace(&self.headers) {
            return std::borrow::Cow::Owned(traced);
        }
        std::borrow::Cow::Borrowed(&self.headers)
    }

    /// The payload bytes.
    pub fn payload_bytes(&self) -> &[u8] {
        &self.payload
    }

    /// Checks every field; the error names the field and what is wrong with it.
    pub fn validate(&self, max_payload_bytes: usize) -> Result<(), Error> {
        check_name("aggregate_type", &self.aggregate_type, MAX_NAME_BYTES)?;
        check_name("aggregate_id", &self.aggregate_id, MAX_AGGREGATE_ID_BYTES)?;
        check_name("event_type", &self.event_type, MAX_NAME_BYTES)?;
        check_name("content_type", &self.content_type, MAX_NAME_BYTES)?;
        if let Some(destination) = &self.destination {
            check_name("destination", destination, MAX_NAME_BYTES)?;
        }
        if self.schema_version < 1 {
            return Err(Error::invalid("schema_version", "must be 1 or more"));
        }
        if matches!(self.aggregate_version, Some(v) if v < 0) {
            return Err(Error::invalid("aggregate_version", "must not be negative"));
        }
        for (name, value) in &self.headers {
            check_header_name(name)?;
            if value.len() > MAX_VALUE_BYTES {
                return Err(Error::invalid(
                    format!("headers.{name}"),
                    format!("is longer than {MAX_VALUE_BYTES} bytes"),
                ));
            }
            if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
                return Err(Error::invalid(
                    format!("headers.{name}"),
                    "must not contain CR, LF or NUL",
                ));
            }
        }
        if self.payload.len() > max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                size: self.payload.len(),
                limit: max_payload_bytes,
            });
        }
        Ok(())
    }
}

/// Validates a batch; in a batch of several, the field is named with the event's index.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn validate_all(events: &[Event], max_payload_bytes: usize) -> Result<(), Error> {
    for (i, event) in events.iter().enumerate() {
        event.validate(max_payload_bytes).map_err(|e| match e {
            Error::InvalidEvent { field, reason } if events.len() > 1 => Error::InvalidEvent {
                field: format!("events[{i}].{field}"),
                reason,
            },
            other => other,
        })?;
    }
    Ok(())
}

fn check_name(field: &str, value: &str, max: usize) -> Result<(), Error> {
    if value.trim().is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(Error::invalid(field, format!("is longer than {max} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    Ok(())
}

/// Header names are HTTP-style tokens so that every broker can carry them.
fn check_header_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            format!("headers.{name}"),
            "name must be 1-255 ASCII letters, digits, '-', '_' or '.'",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> Event {
        Event::new("order", "1", "OrderPlaced")
    }

    #[test]
    fn an_aggregate_id_must_fit_an_index_entry() {
        let long = Event::new("order", "x".repeat(2049), "OrderPlaced");
        let error = long.validate(1024).unwrap_err().to_string();
        assert!(error.contains("aggregate_id"), "{error}");
        assert!(error.contains("2048"), "{error}");
        assert!(Event::new("order", "x".repeat(2048), "OrderPlaced")
            .validate(1024)
            .is_ok());
    }

    #[test]
    fn new_events_get_distinct_time_ordered_ids() {
        let (a, b) = (valid(), valid());
        assert_ne!(a.id(), b.id());
        assert_eq!(a.id().get_version_num(), 7);
        assert!(a.id() < b.id());
    }

    #[test]
    fn names_the_field_that_is_wrong() {
        let cases = [
            (Event::new("", "1", "T"), "aggregate_type must not be empty"),
            (Event::new("a", " ", "T"), "aggregate_id must not be empty"),
            (Event::new("a", "1", "T\n"), "event_type must not contain"),
            (
                valid().schema_version(0),
                "schema_version must be 1 or more",
            ),
            (
                valid().aggregate_version(-1),
                "aggregate_version must not be",
            ),
            (
                valid().header("bad name", "x"),
                "headers.bad name name must",
            ),
            (
                valid().header("trace", "a\r\nb"),
                "headers.trace must not contain CR",
            ),
            (valid().destination(""), "destination must not be empty"),
        ];
        for (event, expected) in cases {
            let err = event
                .validate(DEFAULT_MAX_PAYLOAD_BYTES)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
    }

    #[test]
    fn oversized_payload_names_the_limit() {
        let event = valid().payload(vec![0u8; 11], "application/octet-stream");
        let err = event.validate(10).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid event: payload is 11 bytes, over the limit of 10 bytes"
        );
        assert!(event.validate(11).is_ok());
    }

    #[test]
    fn json_payload_sets_content_type() {
        let event = valid()
            .payload(b"x".to_vec(), "text/plain")
            .json(&[1, 2])
            .unwrap();
        assert_eq!(event.payload_bytes(), b"[1,2]");
        assert_eq!(event.content_type, DEFAULT_CONTENT_TYPE);
    }
}
