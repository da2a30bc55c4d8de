//! Kafka records as the runner and the dead-letter tools handle them: headers kept raw (Kafka
//! allows repeated names and any bytes), read as text where the contract needs it, and written
//! back with changes.

use std::collections::BTreeMap;

use rdkafka::{
    message::{Header, Headers, Message, OwnedHeaders},
    producer::FutureRecord,
};

/// A record's headers as received, in order.
pub(crate) type RawHeaders = Vec<(String, Option<Vec<u8>>)>;

/// The headers of `message`, raw.
pub(crate) fn raw_headers(message: &impl Message) -> RawHeaders {
    message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default()
}

/// The first value of header `name`, as text (lossily: the standard fields then fail to
/// parse and say so).
pub(crate) fn text(headers: &RawHeaders, name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.as_deref())
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Every header as text, the first value of each name.
pub(crate) fn text_headers(headers: &RawHeaders) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (key, value) in headers {
        if let Some(value) = value {
            out.entry(key.clone())
                .or_insert_with(|| String::from_utf8_lossy(value).into_owned());
        }
    }
    out
}

/// `headers` for a record to produce: those `keep` accepts, in order, then `extra`.
pub(crate) fn owned_headers(
    headers: &RawHeaders,
    keep: impl Fn(&str) -> bool,
    extra: &[(&str, &str)],
) -> OwnedHeaders {
    let mut out = OwnedHeaders::new_with_capacity(headers.len() + extra.len());
    for (key, value) in headers.iter().filter(|(key, _)| keep(key)) {
        out = out.insert(Header {
            key,
            value: value.as_ref(),
        });
    }
    for (key, value) in extra {
        out = out.insert(Header {
            key,
            value: Some(value.as_bytes()),
        });
    }
    out
}

/// A record to `topic` with `payload`, `headers` and, when given, `key`.
pub(crate) fn record<'a>(
    topic: &'a str,
    key: Option<&'a [u8]>,
    payload: &'a [u8],
    headers: OwnedHeaders,
) -> FutureRecord<'a, [u8], [u8]> {
    let record = FutureRecord::to(topic).payload(payload).headers(headers);
    match key {
        Some(key) => record.key(key),
        None => record,
    }
}
