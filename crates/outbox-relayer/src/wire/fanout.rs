//! Fan-out during a schema migration: one stored event published as its own version and as
//! copies for consumers that still read an older one.
//!
//! A routing rule lists the copies:
//!
//! ```toml
//! [[relay.routing.rules]]
//! event_type = "OrderPlaced"
//! destination = "orders.v{schema_version}"
//! fan_out = [
//!   # V2 added `region` and `currency`; V1 consumers read orders.v1 until they migrate.
//!   { destination = "orders.v1", schema_version = 1, drop_fields = ["region", "currency"] },
//! ]
//! ```
//!
//! The relay runs no user code from its configuration, so the copy's payload is made by a
//! declarative *downcast*, honest for additive changes only: `drop_fields` removes the
//! top-level fields a later version added, `keep_fields` keeps only those listed; with
//! neither, the payload is sent unchanged. A program that builds the relay as a library can
//! register a Rust function instead ([`Downcasts`]). The copy carries `schema-version` = its
//! own version; the `event-id` header stays the stored event's (the inboxes dedupe on it), but
//! the broker message id is the copy's own ([`copy_message_id`]), so that brokers deduping on it
//! (JetStream `Nats-Msg-Id`) keep both. It also carries `copy-of-schema-version` = the stored
//! version S: a consumer that reads the event's own destination as well skips copies by it
//! (`Processor::skip_fan_out_copies`), so it applies the stored version, never a copy that got
//! ahead of it.
//!
//! Which copies are sent, for a stored event of version S:
//!
//! * a copy of version C < S is downcast and sent;
//! * a copy of version C = S is sent unchanged, unless its destination is the event's own one
//!   (it would be the same message twice);
//! * a copy of version C > S is not sent: the relay cannot invent fields; consumers upcast.
//!
//! The event is marked published only after every copy and the event itself are acknowledged
//! (G3); a failure of any of them retries the whole event, so consumers may see a copy again
//! (the inbox absorbs it).

use std::{collections::BTreeMap, fmt, sync::Arc};

use bytes::Bytes;
use serde_json::Value;
use uuid::Uuid;

pub use crate::wire::routing::FanOutCopy;
use crate::{publisher::PublishError, wire::message::header, wire::message::Message};

impl FanOutCopy {
    /// Whether a payload change is configured.
    fn reshapes(&self) -> bool {
        self.keep_fields.is_some() || !self.drop_fields.is_empty()
    }

    fn reshape(&self, mut object: serde_json::Map<String, Value>) -> Value {
        if let Some(keep) = &self.keep_fields {
            object.retain(|name, _| keep.contains(name));
        }
        for name in &self.drop_fields {
            object.remove(name);
        }
        Value::Object(object)
    }
}

/// A Rust downcast: turns a payload of `from` version into the copy's version.
pub type Downcast = Arc<dyn Fn(i32, Value) -> Result<Value, String> + Send + Sync>;

/// Rust downcasts per (event type, copy version), for programs that build the relay as a
/// library. A registered downcast replaces the copy's `keep_fields` / `drop_fields`.
#[derive(Clone, Default)]
pub struct Downcasts {
    functions: BTreeMap<(String, i32), Downcast>,
}

impl fmt::Debug for Downcasts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.functions.keys()).finish()
    }
}

impl Downcasts {
    /// No Rust downcast: copies use their configured fields.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers how `event_type` copies of version `to` are made from the stored version
    /// (given as the first argument).
    pub fn register(
        mut self,
        event_type: impl Into<String>,
        to: i32,
        downcast: impl Fn(i32, Value) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        self.functions
            .insert((event_type.into(), to), Arc::new(downcast));
        self
    }

    fn get(&self, event_type: &str, to: i32) -> Option<&Downcast> {
        self.functions.get(&(event_type.to_owned(), to))
    }
}

/// The broker message id of a copy: a UUIDv5 of the event id and the copy's version and
/// destination. Deterministic, so a retried copy dedupes against its earlier attempt.
pub fn copy_message_id(event_id: Uuid, schema_version: i32, destination: &str) -> Uuid {
    Uuid::new_v5(
        &event_id,
        format!("schema_version={schema_version};destination={destination}").as_bytes(),
    )
}

/// The copies of `message` to send besides it, in the rule's order.
pub(crate) fn copies(
    message: &Message,
    plan: &[FanOutCopy],
    downcasts: &Downcasts,
) -> Result<Vec<Message>, PublishError> {
    let mut out = Vec::new();
    for copy in plan {
        let destination = crate::wire::routing::render(
            &copy.destination,
            &message.aggregate_type,
            &message.event_type,
            copy.schema_version,
        );
        let same_version = copy.schema_version == message.schema_version;
        if copy.schema_version > message.schema_version
            || (same_version && destination == message.destination)
        {
            continue;
        }
        let payload = if same_version {
            message.payload.clone()
        } else {
            downcast(message, copy, downcasts)?
        };
        // Marks the copy, with the version it was made from, for consumers that read the
        // event's own destination too.
        let mut headers = message.headers.clone();
        headers.retain(|name, _| !name.eq_ignore_ascii_case(header::COPY_OF_SCHEMA_VERSION));
        headers.insert(
            header::COPY_OF_SCHEMA_VERSION.into(),
            message.schema_version.to_string(),
        );
        out.push(Message {
            message_id: copy_message_id(message.event_id, copy.schema_version, &destination),
            schema_version: copy.schema_version,
            destination,
            payload,
            headers,
            ..message.clone()
        });
    }
    Ok(out)
}

fn downcast(
    message: &Message,
    copy: &FanOutCopy,
    downcasts: &Downcasts,
) -> Result<Bytes, PublishError> {
    let rust = downcasts.get(&message.event_type, copy.schema_version);
    if rust.is_none() && !copy.reshapes() {
        return Ok(message.payload.clone());
    }
    let what = || {
        format!(
            "fan-out copy of {} schema_version {} as {} to {:?}",
            message.event_type, message.schema_version, copy.schema_version, copy.destination
        )
    };
    let value: Value = serde_json::from_slice(&message.payload)
        .map_err(|e| PublishError::permanent(format!("{}: payload is not JSON: {e}", what())))?;
    let value = match (rust, value) {
        (Some(f), value) => f(message.schema_version, value)
            .map_err(|e| PublishError::permanent(format!("{}: {e}", what())))?,
        (None, Value::Object(object)) => copy.reshape(object),
        (None, other) => {
            return Err(PublishError::permanent(format!(
                "{}: payload is a JSON {}, not an object, so fields cannot be kept or dropped",
                what(),
                kind(&other)
            )))
        }
    };
    Ok(Bytes::from(
        serde_json::to_vec(&value).expect("a Value serialises"),
    ))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn v2(payload: Value) -> Message {
        Message {
            schema_version: 2,
            destination: "orders.v2".into(),
            payload: Bytes::from(serde_json::to_vec(&payload).unwrap()),
            ..crate::wire::message::sample(1, "o-1")
        }
    }

    fn copy(destination: &str, version: i32) -> FanOutCopy {
        FanOutCopy {
            destination: destination.into(),
            schema_version: version,
            keep_fields: None,
            drop_fields: Vec::new(),
        }
    }

    fn body(m: &Message) -> Value {
        serde_json::from_slice(&m.payload).unwrap()
    }

    #[test]
    fn an_older_copy_drops_the_added_fields_and_gets_its_own_message_id() {
        let m = v2(json!({"order_id": "o-1", "total": 9.5, "region": "eu"}));
        let plan = [FanOutCopy {
            drop_fields: vec!["region".into()],
            ..copy("orders.v{schema_version}", 1)
        }];
        let out = copies(&m, &plan, &Downcasts::new()).unwrap();
        assert_eq!(out.len(), 1);
        let c = &out[0];
        assert_eq!(c.destination, "orders.v1");
        assert_eq!(c.schema_version, 1);
        assert_eq!(body(c), json!({"order_id": "o-1", "total": 9.5}));
        assert_eq!(c.event_id, m.event_id);
        assert_ne!(c.message_id, m.message_id);
        assert_eq!(c.message_id, copy_message_id(m.event_id, 1, "orders.v1"));
        let headers: BTreeMap<_, _> = c.broker_headers().into_iter().collect();
        assert_eq!(headers["schema-version"], "1");
        assert_eq!(headers["event-id"], m.event_id.to_string());
    }

    #[test]
    fn keep_fields_keeps_only_those() {
        let m = v2(json!({"order_id": "o-1", "total": 9.5, "region": "eu", "currency": "EUR"}));
        let plan = [FanOutCopy {
            keep_fields: Some(vec!["order_id".into(), "total".into()]),
            ..copy("orders.v1", 1)
        }];
        let out = copies(&m, &plan, &Downcasts::new()).unwrap();
        assert_eq!(body(&out[0]), json!({"order_id": "o-1", "total": 9.5}));
    }

    #[test]
    fn newer_copies_and_the_same_message_twice_are_not_sent() {
        let m = v2(json!({}));
        let plan = [
            copy("orders.v{schema_version}", 3),
            copy("orders.v{schema_version}", 2),
            copy("audit.orders", 2),
        ];
        let out = copies(&m, &plan, &Downcasts::new()).unwrap();
        let sent: Vec<_> = out.iter().map(|c| c.destination.as_str()).collect();
        assert_eq!(sent, ["audit.orders"]);
        assert_eq!(out[0].payload, m.payload);
    }

    #[test]
    fn a_rust_downcast_replaces_the_configured_fields() {
        let m = v2(json!({"total_cents": 950}));
        let downcasts = Downcasts::new().register("OrderPlaced", 1, |from, mut v| {
            assert_eq!(from, 2);
            let cents = v["total_cents"].as_i64().ok_or("no total_cents")?;
            v["total"] = json!(cents as f64 / 100.0);
            v.as_object_mut().unwrap().remove("total_cents");
            Ok(v)
        });
        let out = copies(&m, &[copy("orders.v1", 1)], &downcasts).unwrap();
        assert_eq!(body(&out[0]), json!({"total": 9.5}));
        let err = copies(&v2(json!({})), &[copy("orders.v1", 1)], &downcasts).unwrap_err();
        assert!(!err.is_transient());
        assert!(err.message.ends_with("no total_cents"), "{err}");
    }

    #[test]
    fn a_payload_that_is_not_an_object_is_a_permanent_error_naming_the_copy() {
        let m = v2(json!([1, 2]));
        let plan = [FanOutCopy {
            drop_fields: vec!["region".into()],
            ..copy("orders.v1", 1)
        }];
        let err = copies(&m, &plan, &Downcasts::new()).unwrap_err();
        assert!(!err.is_transient());
        assert_eq!(
            err.message,
            "fan-out copy of OrderPlaced schema_version 2 as 1 to \"orders.v1\": payload is a \
             JSON array, not an object, so fields cannot be kept or dropped"
        );
    }

    #[test]
    fn checks_name_the_field() {
        let field = "routing.rules[0].fan_out[1]";
        let cases = [
            (
                copy("", 1),
                "routing.rules[0].fan_out[1].destination: must not be empty",
            ),
            (
                copy("x", 0),
                "routing.rules[0].fan_out[1].schema_version: must be 1 or more",
            ),
            (
                FanOutCopy {
                    keep_fields: Some(vec!["a".into()]),
                    drop_fields: vec!["b".into()],
                    ..copy("x", 1)
                },
                "routing.rules[0].fan_out[1]: set keep_fields or drop_fields, not both",
            ),
            (
                FanOutCopy {
                    drop_fields: vec![" ".into()],
                    ..copy("x", 1)
                },
                "routing.rules[0].fan_out[1].drop_fields: field names must not be empty",
            ),
        ];
        for (c, expected) in cases {
            assert_eq!(c.check(field).unwrap_err(), expected);
        }
    }
}
