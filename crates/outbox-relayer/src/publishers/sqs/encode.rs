//! How a [`Message`] becomes an SQS message: body, message attributes, FIFO group and
//! deduplication ids. Pure functions, so they are tested without the network.

use std::collections::BTreeMap;

use base64::Engine as _;

use crate::wire::message::Message;

/// SQS allows at most this many message attributes on one message.
pub const MAX_ATTRIBUTES: usize = 10;

/// The attribute carrying the writer's headers as one JSON object (string to string) when they
/// do not fit as attributes of their own.
pub const HEADERS_ATTRIBUTE: &str = "outbox-headers";

/// The attribute saying the body is the payload in base64 (its value is `base64`), set only for
/// payloads that are not valid SQS text.
pub const BODY_ENCODING_ATTRIBUTE: &str = "outbox-body-encoding";

/// The one value [`BODY_ENCODING_ATTRIBUTE`] takes.
pub const BASE64: &str = "base64";

/// Longest FIFO `MessageGroupId` SQS accepts.
const MAX_GROUP_ID: usize = 128;

/// One message, ready to go into a `SendMessageBatch` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The body: the payload, or its base64 when it is not valid SQS text.
    pub body: String,
    /// Message attributes (all of data type `String`), at most [`MAX_ATTRIBUTES`].
    pub attributes: Vec<(String, String)>,
    /// FIFO queues: the ordering key.
    pub group_id: Option<String>,
    /// FIFO queues: the event id.
    pub deduplication_id: Option<String>,
}

impl Entry {
    /// The size SQS counts against its limit: the body plus each attribute's name, data type
    /// and value.
    pub fn size(&self) -> usize {
        self.body.len()
            + self
                .attributes
                .iter()
                .map(|(name, value)| name.len() + "String".len() + value.len())
                .sum::<usize>()
    }
}

/// Encodes `message` for a standard (`fifo` false) or FIFO queue.
///
/// Attributes: the relay's standard headers (`event-id`, `event-type`, …; an empty value is
/// left out, SQS refuses empty attributes), then the writer's headers, each as its own
/// attribute when all of them fit within SQS's 10 and every name and value is valid for an
/// attribute; otherwise all of the writer's headers travel in one JSON object attribute,
/// `outbox-headers`. A payload that is not valid SQS text is sent in base64 with
/// `outbox-body-encoding: base64`.
pub fn encode(message: &Message, fifo: bool) -> Entry {
    let (body, base64) = match std::str::from_utf8(&message.payload) {
        Ok(text) if text.chars().all(is_sqs_char) => (text.to_owned(), false),
        _ => (
            base64::engine::general_purpose::STANDARD.encode(&message.payload),
            true,
        ),
    };
    let mut standard = Vec::with_capacity(MAX_ATTRIBUTES);
    let mut writer = BTreeMap::new();
    let mut writer_fits = true;
    let mut is_writer = true;
    message.visit_headers(|name, value| {
        // The writer's headers come first, then the standard ones, starting with event-id.
        if name == crate::wire::message::header::EVENT_ID {
            is_writer = false;
        }
        if is_writer {
            writer_fits &= is_attribute_name(name)
                && is_attribute_value(value)
                && name != HEADERS_ATTRIBUTE
                && name != BODY_ENCODING_ATTRIBUTE;
            writer.insert(name.to_owned(), value.to_owned());
        } else if !value.is_empty() {
            standard.push((name.to_owned(), value.to_owned()));
        }
    });
    let mut attributes = standard;
    if base64 {
        attributes.push((BODY_ENCODING_ATTRIBUTE.to_owned(), BASE64.to_owned()));
    }
    if !writer.is_empty() {
        if writer_fits && attributes.len() + writer.len() <= MAX_ATTRIBUTES {
            attributes.extend(writer);
        } else {
            let json = serde_json::to_string(&writer).expect("a string map serializes");
            attributes.push((HEADERS_ATTRIBUTE.to_owned(), json));
        }
    }
    let (group_id, deduplication_id) = if fifo {
        (
            Some(group_id(&message.aggregate_type, &message.aggregate_id)),
            Some(message.message_id.to_string()),
        )
    } else {
        (None, None)
    };
    Entry {
        body,
        attributes,
        group_id,
        deduplication_id,
    }
}

/// The FIFO message group of an aggregate: `type:id` when that is a valid group id (at most
/// 128 printable ASCII characters), else a prefix of it followed by a 64-bit FNV-1a hash of
/// the whole key. Two aggregates can only share a group (so be ordered together, never less
/// ordered) if their keys collide.
pub fn group_id(aggregate_type: &str, aggregate_id: &str) -> String {
    let key = format!("{aggregate_type}:{aggregate_id}");
    if key.len() <= MAX_GROUP_ID && key.chars().all(|c| c.is_ascii_graphic()) {
        return key;
    }
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let prefix: String = key
        .chars()
        .filter(char::is_ascii_graphic)
        .take(MAX_GROUP_ID - 17)
        .collect();
    format!("{prefix}~{hash:016x}")
}

/// Whether SQS accepts `c` in a body or attribute value: `#x9 | #xA | #xD | #x20-#xD7FF |
/// #xE000-#xFFFD | #x10000-#x10FFFF`.
fn is_sqs_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' '..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

fn is_attribute_value(value: &str) -> bool {
    !value.is_empty() && value.chars().all(is_sqs_char)
}

/// SQS attribute names: up to 256 of `A-Za-z0-9_-.`, not starting or ending with `.`, no `..`,
/// and not starting with `AWS.` or `Amazon.` (any case).
fn is_attribute_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.is_empty()
        && name.len() <= 256
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
}

/// The writer's and the relay's headers back from a received message's string attributes:
/// every attribute except [`BODY_ENCODING_ATTRIBUTE`], with [`HEADERS_ATTRIBUTE`] expanded.
/// What a consumer does to read what [`encode`] wrote (the conformance harness uses it).
pub fn decode_headers(
    attributes: impl IntoIterator<Item = (String, String)>,
) -> Result<BTreeMap<String, String>, String> {
    let mut headers = BTreeMap::new();
    let mut packed = None;
    for (name, value) in attributes {
        match name.as_str() {
            BODY_ENCODING_ATTRIBUTE => {}
            HEADERS_ATTRIBUTE => packed = Some(value),
            _ => {
                headers.insert(name, value);
            }
        }
    }
    if let Some(json) = packed {
        let writer: BTreeMap<String, String> = serde_json::from_str(&json)
            .map_err(|e| format!("{HEADERS_ATTRIBUTE} is not a JSON string map: {e}"))?;
        for (name, value) in writer {
            headers.entry(name).or_insert(value);
        }
    }
    Ok(headers)
}

/// The payload back from a received body and the value of [`BODY_ENCODING_ATTRIBUTE`].
pub fn decode_body(body: &str, encoding: Option<&str>) -> Result<Vec<u8>, String> {
    match encoding {
        None => Ok(body.as_bytes().to_vec()),
        Some(BASE64) => base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|e| format!("body is not base64: {e}")),
        Some(other) => Err(format!("unknown {BODY_ENCODING_ATTRIBUTE} {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::wire::message::sample;

    fn names(entry: &Entry) -> Vec<&str> {
        entry.attributes.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn few_writer_headers_travel_as_attributes() {
        let m = sample(7, "a1");
        let entry = encode(&m, false);
        assert_eq!(entry.body, "{}");
        assert!(entry.attributes.len() <= MAX_ATTRIBUTES);
        assert!(names(&entry).contains(&"traceparent"), "{entry:?}");
        assert!(!names(&entry).contains(&HEADERS_ATTRIBUTE));
        let headers = decode_headers(entry.attributes.clone()).unwrap();
        assert_eq!(headers, m.broker_headers().into_iter().collect());
        assert_eq!(entry.group_id, None);
        assert_eq!(entry.deduplication_id, None);
    }

    #[test]
    fn many_writer_headers_travel_as_one_json_attribute() {
        let mut m = sample(7, "a1");
        for i in 0..20 {
            m.headers.insert(format!("x-{i}"), format!("v{i}"));
        }
        let entry = encode(&m, false);
        assert_eq!(entry.attributes.len(), 9, "8 standard + the JSON one");
        assert!(names(&entry).contains(&HEADERS_ATTRIBUTE));
        let headers = decode_headers(entry.attributes).unwrap();
        assert_eq!(headers, m.broker_headers().into_iter().collect());
    }

    #[test]
    fn invalid_attribute_names_or_values_go_into_json() {
        for (name, value) in [
            ("has space", "v"),
            ("AWS.trace", "v"),
            ("a..b", "v"),
            ("empty", ""),
            ("ctrl", "a\u{1}b"),
        ] {
            let mut m = sample(7, "a1");
            m.headers.insert(name.into(), value.into());
            let entry = encode(&m, false);
            assert!(names(&entry).contains(&HEADERS_ATTRIBUTE), "{name:?}");
            let headers = decode_headers(entry.attributes).unwrap();
            assert_eq!(headers.get(name).map(String::as_str), Some(value));
        }
    }

    #[test]
    fn non_text_payloads_go_base64_and_come_back() {
        for payload in [&[0xff, 0x00, 0x10][..], b"nul\0inside", b"\x01"] {
            let mut m = sample(1, "a1");
            m.payload = Bytes::copy_from_slice(payload);
            let entry = encode(&m, false);
            let encoding = entry
                .attributes
                .iter()
                .find(|(n, _)| n == BODY_ENCODING_ATTRIBUTE)
                .map(|(_, v)| v.as_str());
            assert_eq!(encoding, Some(BASE64));
            assert!(entry.attributes.len() <= MAX_ATTRIBUTES);
            assert_eq!(decode_body(&entry.body, encoding).unwrap(), payload);
        }
        let mut m = sample(1, "a1");
        m.payload = Bytes::from("naïve café ✓\n\t");
        let entry = encode(&m, false);
        assert_eq!(entry.body, "naïve café ✓\n\t");
        assert!(!names(&entry).contains(&BODY_ENCODING_ATTRIBUTE));
    }

    #[test]
    fn fifo_entries_carry_group_and_dedupe_ids() {
        let m = sample(1, "a1");
        let entry = encode(&m, true);
        assert_eq!(entry.group_id.as_deref(), Some("order:a1"));
        assert_eq!(entry.deduplication_id, Some(m.event_id.to_string()));
    }

    #[test]
    fn group_ids_are_valid_and_stable() {
        let long = "x".repeat(300);
        for (t, id) in [("order", "a b"), ("order", "ünï"), ("order", long.as_str())] {
            let g = group_id(t, id);
            assert!(g.len() <= MAX_GROUP_ID, "{g}");
            assert!(g.chars().all(|c| c.is_ascii_graphic()), "{g}");
            assert_eq!(g, group_id(t, id));
        }
        assert_ne!(group_id("order", "a b"), group_id("order", "a  b"));
    }

    #[test]
    fn size_counts_body_and_attributes() {
        let entry = Entry {
            body: "abc".into(),
            attributes: vec![("k".into(), "vv".into())],
            group_id: None,
            deduplication_id: None,
        };
        assert_eq!(entry.size(), 3 + 1 + 6 + 2);
    }
}
