//! The CloudEvents 1.0 envelope (`envelope = "cloudevents-binary"` or
//! `"cloudevents-structured"`), for consumers in other languages that read CloudEvents.
//!
//! | attribute | value |
//! | --- | --- |
//! | `specversion` | `1.0` |
//! | `id` | the event id |
//! | `source` | `cloudevents_source`, rendered (default `/outbox/{aggregate_type}`) |
//! | `type` | the event type |
//! | `time` | `occurred_at`, RFC 3339 |
//! | `subject` | the aggregate id |
//! | `datacontenttype` | the row's content type |
//! | `schemaversion` (extension) | the schema version |
//! | `aggregatetype` (extension) | the aggregate type |
//! | `aggregateversion` (extension) | the aggregate version, when the writer gave one |
//!
//! **Binary mode** keeps the payload as the body and puts each attribute in a header named by
//! the broker's protocol binding: `ce-` (HTTP, NATS; also Redis and SQS, which have no
//! binding), `ce_` (Kafka), `cloudEvents:` (AMQP: RabbitMQ, Service Bus), the bare name (MQTT 5
//! user properties). `datacontenttype` is the `content-type` header, or the content-type
//! property where the protocol has one (AMQP, MQTT).
//!
//! **Structured mode** sends the JSON event format as the body, with content type
//! `application/cloudevents+json`: the payload is `data` when it is JSON (or text, for a
//! `text/*` content type), else `data_base64`.
//!
//! In both modes the writer's own headers (`traceparent`, …) travel unchanged beside the
//! attributes; the relay's native headers (`event-id`, …) are not sent.

use std::collections::BTreeMap;

use base64::Engine as _;
use bytes::Bytes;
use chrono::SecondsFormat;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::{wire::message::header, wire::message::Message};

pub use outbox::wire::cloudevents::STRUCTURED_CONTENT_TYPE;

/// How events go on the wire (`envelope` in `[relay]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Envelope {
    /// The payload as the body, the relay's native headers (`event-id`, `event-type`,
    /// `schema-version`, …). The default.
    #[default]
    Outbox,
    /// CloudEvents binary content mode: attributes in headers, the payload as the body.
    CloudeventsBinary,
    /// CloudEvents structured content mode: the JSON event format as the body.
    CloudeventsStructured,
}

/// How a protocol binding names attribute headers, chosen from the publisher's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// `ce-` headers, `content-type` header (HTTP, NATS; Redis and SQS by analogy).
    Http,
    /// `ce_` headers, `content-type` header.
    Kafka,
    /// `cloudEvents:` application properties; content type in the message property.
    Amqp,
    /// Unprefixed user properties; content type in the message property.
    Mqtt,
}

impl Binding {
    /// The binding of a publisher ([`crate::publisher::Publisher::name`]).
    pub fn of(publisher: &str) -> Self {
        match publisher {
            "kafka" => Self::Kafka,
            "rabbitmq" | "servicebus" | "amqp1" => Self::Amqp,
            "mqtt" => Self::Mqtt,
            _ => Self::Http,
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Http => "ce-",
            Self::Kafka => "ce_",
            Self::Amqp => "cloudEvents:",
            Self::Mqtt => "",
        }
    }

    /// Whether the content type travels as a header (else as the protocol's own property,
    /// which publishers set from [`Message::content_type`]).
    fn content_type_header(self) -> bool {
        matches!(self, Self::Http | Self::Kafka)
    }
}

/// The message in `envelope` for `binding`; `source` is the rendered `source` attribute.
pub fn encode(message: &Message, envelope: Envelope, binding: Binding, source: &str) -> Message {
    match envelope {
        Envelope::Outbox => message.clone(),
        Envelope::CloudeventsBinary => binary(message, binding, source),
        Envelope::CloudeventsStructured => structured(message, binding, source),
    }
}

/// The attributes, as strings, in the order of the table above.
fn attributes(message: &Message, source: &str) -> Vec<(&'static str, String)> {
    let mut out = vec![
        ("specversion", "1.0".to_owned()),
        ("id", message.event_id.to_string()),
        ("source", source.to_owned()),
        ("type", message.event_type.clone()),
        (
            "time",
            message
                .occurred_at
                .to_rfc3339_opts(SecondsFormat::Micros, true),
        ),
        ("subject", message.aggregate_id.clone()),
        ("datacontenttype", message.content_type.clone()),
        ("schemaversion", message.schema_version.to_string()),
        ("aggregatetype", message.aggregate_type.clone()),
    ];
    if let Some(v) = message.aggregate_version {
        out.push(("aggregateversion", v.to_string()));
    }
    out
}

/// The writer's headers that may travel beside the attributes: not one that a consumer would
/// read as an attribute or a native header (a writer cannot forge the event id that way).
fn writer_headers(message: &Message) -> BTreeMap<String, String> {
    message
        .headers
        .iter()
        .filter(|(name, _)| message.may_carry_writer_header(name))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn binary(message: &Message, binding: Binding, source: &str) -> Message {
    let mut headers = writer_headers(message);
    for (name, value) in attributes(message, source) {
        if name == "datacontenttype" {
            if binding.content_type_header() {
                headers.insert(header::CONTENT_TYPE.into(), value);
            }
            continue;
        }
        headers.insert(format!("{}{name}", binding.prefix()), value);
    }
    Message {
        headers,
        native_headers: false,
        ..message.clone()
    }
}

fn structured(message: &Message, binding: Binding, source: &str) -> Message {
    let mut event = serde_json::Map::new();
    for (name, value) in attributes(message, source) {
        // The one integer attribute; the aggregate version may exceed CloudEvents' 32-bit
        // Integer, so it stays a string.
        let value = match name {
            "schemaversion" => json!(message.schema_version),
            _ => Value::String(value),
        };
        event.insert(name.to_owned(), value);
    }
    let (name, data) = data(message);
    event.insert(name.to_owned(), data);
    let mut headers = writer_headers(message);
    if binding.content_type_header() {
        headers.insert(header::CONTENT_TYPE.into(), STRUCTURED_CONTENT_TYPE.into());
    }
    Message {
        payload: Bytes::from(serde_json::to_vec(&event).expect("a Value serialises")),
        content_type: STRUCTURED_CONTENT_TYPE.into(),
        headers,
        native_headers: false,
        ..message.clone()
    }
}

/// `data` for JSON (and text) payloads, `data_base64` for anything else.
fn data(message: &Message) -> (&'static str, Value) {
    let media = message
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let is_json = media == "application/json" || media.ends_with("+json");
    if is_json {
        if let Ok(value) = serde_json::from_slice::<Value>(&message.payload) {
            return ("data", value);
        }
    } else if media.starts_with("text/") {
        if let Ok(text) = std::str::from_utf8(&message.payload) {
            return ("data", Value::String(text.to_owned()));
        }
    }
    (
        "data_base64",
        Value::String(base64::engine::general_purpose::STANDARD.encode(&message.payload)),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn sample() -> Message {
        Message {
            payload: Bytes::from_static(br#"{"total":9.5}"#),
            ..crate::wire::message::sample(7, "o-1")
        }
    }

    fn wire(m: &Message) -> HashMap<String, String> {
        m.broker_headers().into_iter().collect()
    }

    #[test]
    fn outbox_envelope_changes_nothing() {
        let m = sample();
        assert_eq!(encode(&m, Envelope::Outbox, Binding::Http, "/x"), m);
    }

    #[test]
    fn binary_mode_puts_the_attributes_in_prefixed_headers() {
        let m = sample();
        let e = encode(
            &m,
            Envelope::CloudeventsBinary,
            Binding::Http,
            "/outbox/order",
        );
        let h = wire(&e);
        assert_eq!(h["ce-specversion"], "1.0");
        assert_eq!(h["ce-id"], m.event_id.to_string());
        assert_eq!(h["ce-source"], "/outbox/order");
        assert_eq!(h["ce-type"], "OrderPlaced");
        assert_eq!(h["ce-subject"], "o-1");
        assert_eq!(h["ce-schemaversion"], "2");
        assert_eq!(h["ce-aggregatetype"], "order");
        assert_eq!(h["ce-aggregateversion"], "7");
        assert!(h["ce-time"].ends_with('Z'));
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h["traceparent"], "00-abc-def-01");
        // Neither the native headers nor the writer's forged `event-id` go out.
        assert!(!h.contains_key("event-id") && !h.contains_key("schema-version"));
        assert_eq!(e.payload, m.payload);
        assert_eq!(e.message_id, m.message_id);
    }

    #[test]
    fn each_binding_has_its_prefix() {
        let m = sample();
        for (binding, id, content_type) in [
            (Binding::Kafka, "ce_id", true),
            (Binding::Amqp, "cloudEvents:id", false),
            (Binding::Mqtt, "id", false),
        ] {
            let h = wire(&encode(&m, Envelope::CloudeventsBinary, binding, "/s"));
            assert_eq!(h[id], m.event_id.to_string(), "{binding:?}");
            assert_eq!(h.contains_key("content-type"), content_type, "{binding:?}");
            assert!(!h.keys().any(|k| k.ends_with("datacontenttype")));
        }
        assert_eq!(Binding::of("rabbitmq"), Binding::Amqp);
        assert_eq!(Binding::of("kafka"), Binding::Kafka);
        assert_eq!(Binding::of("nats"), Binding::Http);
    }

    #[test]
    fn structured_mode_sends_the_json_event_format() {
        let m = sample();
        let e = encode(&m, Envelope::CloudeventsStructured, Binding::Http, "/s");
        assert_eq!(e.content_type, STRUCTURED_CONTENT_TYPE);
        assert_eq!(wire(&e)["content-type"], STRUCTURED_CONTENT_TYPE);
        let body: Value = serde_json::from_slice(&e.payload).unwrap();
        assert_eq!(body["specversion"], "1.0");
        assert_eq!(body["id"], m.event_id.to_string());
        assert_eq!(body["type"], "OrderPlaced");
        assert_eq!(body["source"], "/s");
        assert_eq!(body["subject"], "o-1");
        assert_eq!(body["schemaversion"], 2);
        assert_eq!(body["aggregateversion"], "7");
        assert_eq!(body["datacontenttype"], "application/json");
        assert_eq!(body["data"], json!({"total": 9.5}));
        assert!(body.get("data_base64").is_none());
    }

    #[test]
    fn non_json_payloads_go_in_data_base64_and_text_in_data() {
        let bytes = Message {
            payload: Bytes::from_static(&[0, 159, 146, 150]),
            content_type: "application/octet-stream".into(),
            ..sample()
        };
        let e = encode(&bytes, Envelope::CloudeventsStructured, Binding::Http, "/s");
        let body: Value = serde_json::from_slice(&e.payload).unwrap();
        assert_eq!(body["data_base64"], "AJ+Slg==");
        assert!(body.get("data").is_none());
        // JSON content type but a body that is not JSON: still delivered, as bytes.
        let broken = Message {
            payload: Bytes::from_static(b"{oops"),
            ..sample()
        };
        let e = encode(
            &broken,
            Envelope::CloudeventsStructured,
            Binding::Http,
            "/s",
        );
        let body: Value = serde_json::from_slice(&e.payload).unwrap();
        assert_eq!(body["data_base64"], "e29vcHM=");
        let text = Message {
            payload: Bytes::from_static("héllo".as_bytes()),
            content_type: "text/plain; charset=utf-8".into(),
            ..sample()
        };
        let e = encode(&text, Envelope::CloudeventsStructured, Binding::Http, "/s");
        let body: Value = serde_json::from_slice(&e.payload).unwrap();
        assert_eq!(body["data"], "héllo");
    }

    #[test]
    fn config_names_read_well() {
        #[derive(Deserialize)]
        struct C {
            envelope: Envelope,
        }
        for (text, expected) in [
            ("outbox", Envelope::Outbox),
            ("cloudevents-binary", Envelope::CloudeventsBinary),
            ("cloudevents-structured", Envelope::CloudeventsStructured),
        ] {
            let c: C = serde_json::from_value(json!({ "envelope": text })).unwrap();
            assert_eq!(c.envelope, expected);
        }
    }
}
