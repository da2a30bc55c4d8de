//! What the dead-letter listing shows of a row: every column bounded, whatever a writer
//! stored, and the values of sensitive headers replaced by `[redacted]`.
//!
//! The listing statements read each text column cut in SQL (`{text_read}` characters, or
//! `{text_read_bytes}` bytes on SQLite, which keeps any bytes), the error `{error_read}`
//! characters, and the headers only when their JSON text is at most `{headers_read}` bytes.
//! [`bound`] then cuts each value to its limit here and names the cut fields in
//! [`DeadLetter::truncated`]. So one listed row costs the relay at most about 90 KiB however
//! large the row is (a 50 MB destination included), and a response at most that times its
//! `limit`. The payload is never read (only its size).

use serde_json::{Map, Value};

use super::DeadLetter;

/// Characters shown of each text column (aggregate type and id, event id and type,
/// destination, content type).
pub(crate) const TEXT_LIMIT: usize = 1024;
/// Characters shown of the last error.
pub(crate) const ERROR_LIMIT: usize = 4096;
/// Headers whose JSON text is longer than this many bytes are not read: the claim's own limit
/// (`MAX_HEADERS` in `store/rows.rs`), so such a row is dead for that reason.
pub(crate) const HEADERS_READ_LIMIT: usize = 65536;
/// Headers shown per row (in name order).
pub(crate) const HEADER_ENTRIES_LIMIT: usize = 32;
/// Characters shown of a header's name.
pub(crate) const HEADER_NAME_LIMIT: usize = 128;
/// Characters shown of a header's value (or of its JSON text, when it is not a string).
pub(crate) const HEADER_VALUE_LIMIT: usize = 256;
/// What replaces the value of a sensitive header.
pub(crate) const REDACTED: &str = "[redacted]";

/// `sql` with the listing's read limits in place of `{text_read}`, `{text_read_bytes}`,
/// `{error_read}` and `{headers_read}`. One character more than shown is read, so that a cut
/// can be told from a value of exactly the limit.
pub(crate) fn render_limits(sql: &str) -> String {
    sql.replace("{text_read_bytes}", &(4 * TEXT_LIMIT + 4).to_string())
        .replace("{text_read}", &(TEXT_LIMIT + 1).to_string())
        .replace("{error_read}", &(ERROR_LIMIT + 1).to_string())
        .replace("{headers_read}", &HEADERS_READ_LIMIT.to_string())
}

/// The headers as the listing reads them, from their JSON text when it was read (`None`: over
/// [`HEADERS_READ_LIMIT`], `size` bytes), and the fields cut so far. Text that is not JSON the
/// relay reads is kept as a JSON string; [`bound`] cuts and redacts either.
pub(crate) fn read_headers(text: Option<String>, size: i64) -> (Value, Vec<&'static str>) {
    match text {
        Some(text) => (
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            Vec::new(),
        ),
        None => (
            Value::String(format!(
                "[not shown: {size} bytes, over the listing's limit of {HEADERS_READ_LIMIT} \
                 bytes]"
            )),
            vec!["headers"],
        ),
    }
}

/// Cuts every value of `letter` to its limit, redacts sensitive headers, and adds the fields
/// it cut to `truncated`.
pub(super) fn bound(letter: &mut DeadLetter) {
    let mut cut = std::mem::take(&mut letter.truncated);
    let mut text = |name: &'static str, value: &mut String, limit: usize| {
        if cut_to(value, limit) {
            cut.push(name);
        }
    };
    text("event_id", &mut letter.event_id, TEXT_LIMIT);
    text("aggregate_type", &mut letter.aggregate_type, TEXT_LIMIT);
    text("aggregate_id", &mut letter.aggregate_id, TEXT_LIMIT);
    text("event_type", &mut letter.event_type, TEXT_LIMIT);
    if let Some(destination) = &mut letter.destination {
        text("destination", destination, TEXT_LIMIT);
    }
    text("content_type", &mut letter.content_type, TEXT_LIMIT);
    text("last_error", &mut letter.last_error, ERROR_LIMIT);
    if bound_headers(&mut letter.headers) && !cut.contains(&"headers") {
        cut.push("headers");
    }
    letter.truncated = cut;
}

/// Keeps the first [`HEADER_ENTRIES_LIMIT`] headers, cuts names and values, and redacts the
/// values of sensitive names (at any depth, for values that are not strings). Headers that
/// are not an object (text that is not JSON included) are shown as their text, cut, or
/// redacted whole when it names a sensitive header. Returns whether anything was cut.
fn bound_headers(headers: &mut Value) -> bool {
    let Value::Object(map) = headers else {
        let mut text = match &mut *headers {
            Value::String(s) => std::mem::take(s),
            other => other.to_string(),
        };
        let cut = cut_to(&mut text, HEADER_VALUE_LIMIT);
        *headers = Value::String(if mentions_sensitive(&text) {
            REDACTED.to_owned()
        } else {
            text
        });
        return cut;
    };
    let mut cut = map.len() > HEADER_ENTRIES_LIMIT;
    let mut shown = Map::new();
    for (mut name, mut value) in std::mem::take(map).into_iter().take(HEADER_ENTRIES_LIMIT) {
        // A name cut at the limit is redacted too: its end, which may say `token`, is unseen.
        let name_cut = cut_to(&mut name, HEADER_NAME_LIMIT);
        cut |= name_cut;
        if name_cut || is_sensitive(&name) {
            value = Value::String(REDACTED.to_owned());
        }
        redact_nested(&mut value);
        let mut text = match value {
            Value::String(s) => s,
            other => {
                let text = other.to_string();
                if text.chars().count() <= HEADER_VALUE_LIMIT {
                    shown.insert(name, other);
                    continue;
                }
                text
            }
        };
        cut |= cut_to(&mut text, HEADER_VALUE_LIMIT);
        shown.insert(name, Value::String(text));
    }
    *map = shown;
    cut
}

/// Redacts the values of sensitive names inside a value that is not a string (headers are a
/// string map; a row that stores an object there is dead for that reason, and shown).
fn redact_nested(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (name, inner) in map.iter_mut() {
                if is_sensitive(name) {
                    *inner = Value::String(REDACTED.to_owned());
                } else {
                    redact_nested(inner);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_nested),
        _ => {}
    }
}

/// Header names whose values are credentials, compared case-insensitively: exact names, and
/// names containing one of [`SENSITIVE_PARTS`].
const SENSITIVE_NAMES: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
];

/// Parts of a header name that make it sensitive wherever they appear in it.
const SENSITIVE_PARTS: &[&str] = &[
    "token",
    "secret",
    "password",
    "api-key",
    "apikey",
    "api_key",
    "signature",
    "authorization",
    // `x-functions-key`, `ocp-apim-subscription-key`, `private-key`, `x-amz-credential`.
    "key",
    "credential",
    "cookie",
];

/// Whether the value of header `name` is a credential the listing must not show.
pub(crate) fn is_sensitive(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SENSITIVE_NAMES.contains(&name.as_str()) || SENSITIVE_PARTS.iter().any(|p| name.contains(p))
}

/// Whether `text` (headers that are not an object) mentions a sensitive header name.
fn mentions_sensitive(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    SENSITIVE_NAMES
        .iter()
        .chain(SENSITIVE_PARTS)
        .any(|p| text.contains(p))
}

/// Cuts `text` to `limit` characters; returns whether it was longer.
fn cut_to(text: &mut String, limit: usize) -> bool {
    match text.char_indices().nth(limit) {
        Some((at, _)) => {
            text.truncate(at);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn sensitive_names_are_found_whatever_their_case() {
        for name in [
            "Authorization",
            "PROXY-AUTHORIZATION",
            "cookie",
            "Set-Cookie",
            "X-Api-Key",
            "x-auth-token",
            "client_secret",
            "db-password",
            "my-apikey",
            "stripe-signature",
        ] {
            assert!(is_sensitive(name), "{name}");
        }
        for name in ["traceparent", "tenant", "content-type", "x-correlation-id"] {
            assert!(!is_sensitive(name), "{name}");
        }
    }

    #[test]
    fn headers_are_cut_and_redacted() {
        let long_name = "n".repeat(HEADER_NAME_LIMIT + 1);
        let mut headers = json!({
            "Authorization": "Bearer abc",
            "traceparent": "00-abc",
            "big": "v".repeat(HEADER_VALUE_LIMIT + 5),
            "nested": {"x-session-token": "s3cret", "ok": 1},
            long_name: "a value",
        });
        assert!(bound_headers(&mut headers));
        assert_eq!(headers["Authorization"], REDACTED);
        assert_eq!(headers["traceparent"], "00-abc");
        assert_eq!(
            headers["big"].as_str().unwrap().len(),
            HEADER_VALUE_LIMIT,
            "cut"
        );
        assert_eq!(
            headers["nested"],
            json!({"x-session-token": REDACTED, "ok": 1})
        );
        assert_eq!(headers["n".repeat(HEADER_NAME_LIMIT)], REDACTED);

        let mut many = Value::Object(
            (0..HEADER_ENTRIES_LIMIT + 3)
                .map(|i| (format!("h{i:03}"), json!("v")))
                .collect(),
        );
        assert!(bound_headers(&mut many));
        assert_eq!(many.as_object().unwrap().len(), HEADER_ENTRIES_LIMIT);

        let mut small = json!({"tenant": "t1"});
        assert!(!bound_headers(&mut small));
        let mut text = json!("not json with an authorization: x");
        bound_headers(&mut text);
        assert_eq!(text, REDACTED);
        let mut text = json!("not json");
        assert!(!bound_headers(&mut text));
        assert_eq!(text, "not json");
    }

    #[test]
    fn a_cut_counts_characters_not_bytes() {
        let mut text = "é".repeat(5);
        assert!(cut_to(&mut text, 3));
        assert_eq!(text, "ééé");
        let mut exact = "abc".to_owned();
        assert!(!cut_to(&mut exact, 3));
    }
}
