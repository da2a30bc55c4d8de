//! Which headers a webhook request carries: the relay's own, then the message's, each name
//! once.
//!
//! The writer's headers are event data. On HTTP some names are not metadata but transport:
//! they choose the virtual host, frame the body, steer proxies or carry credentials. A writer's
//! header is dropped, in any case of its name, when it is
//! - one the relay sets on the request: `content-type`, `idempotency-key`, `webhook-id`,
//!   `webhook-timestamp`, `webhook-signature`, `user-agent`, the native headers (`event-id`,
//!   …) and the retired `x-outbox-signature`;
//! - hop-by-hop or framing: `host`, `content-length`, `transfer-encoding`, `connection`,
//!   `keep-alive`, `upgrade`, `te`, `trailer`, `expect`, `proxy-*`;
//! - read by proxies and frameworks as facts about the connection: `forwarded`, `via`,
//!   `x-forwarded-*`, `x-real-ip`;
//! - credentials for the receiver: `authorization`, `cookie` (the operator's configuration
//!   decides how the relay authenticates, never an event).
//!
//! Two writer headers whose names differ only in case travel once, the first in byte order.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::wire::message::header;

/// Headers the relay sets on every webhook request (besides the native ones).
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Standard Webhooks: the message id (the event id; a fan-out copy's own id).
pub(crate) const WEBHOOK_ID: &str = "webhook-id";
/// Standard Webhooks: unix seconds when the request was sent.
pub(crate) const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// Standard Webhooks: space-separated `v1,<base64>` signatures, one per secret.
pub(crate) const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// Lowercase names no writer header may take.
const DROPPED: &[&str] = &[
    // Set by the relay.
    header::CONTENT_TYPE,
    IDEMPOTENCY_KEY,
    WEBHOOK_ID,
    WEBHOOK_TIMESTAMP,
    WEBHOOK_SIGNATURE,
    "user-agent",
    // The body-only signature the relay sent before Standard Webhooks; a receiver not yet
    // updated may still check it, so no writer may supply one.
    "x-outbox-signature",
    // Hop-by-hop and framing.
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "expect",
    // Connection facts proxies and frameworks trust.
    "forwarded",
    "via",
    "x-real-ip",
    // Credentials.
    "authorization",
    "cookie",
];

/// Lowercase name prefixes no writer header may start with.
const DROPPED_PREFIXES: &[&str] = &["proxy-", "x-forwarded-"];

/// Whether a writer's header `name` is dropped from the request. `_` counts as `-`: servers
/// that hand headers to applications as CGI variables (`HTTP_EVENT_ID`: PHP, Rack, WSGI) read
/// `event_id` and `event-id` as one.
fn dropped(name: &str) -> bool {
    let lower = name.to_ascii_lowercase().replace('_', "-");
    DROPPED.contains(&lower.as_str())
        || header::ALL.contains(&lower.as_str())
        || DROPPED_PREFIXES.iter().any(|p| lower.starts_with(p))
}

/// The request's headers: `own` (the relay's: content type, idempotency key, signature) first,
/// then the message's native headers, then the rest of the message's headers that are not
/// [`dropped`]. A name or value HTTP cannot carry is an error naming the header.
pub(crate) fn request_headers(
    own: impl IntoIterator<Item = (&'static str, String)>,
    message: &crate::wire::message::Message,
) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value) in own {
        map.insert(
            HeaderName::from_static(name),
            HeaderValue::try_from(value)
                .map_err(|_| format!("the value of header `{name}` cannot go in HTTP"))?,
        );
    }
    let mut error = None;
    message.visit_headers(|name, value| {
        if error.is_some() {
            return;
        }
        // The relay's native headers come with their exact names (a writer's of the same
        // name is left out by the message itself); any other spelling is a writer's.
        let native = message.native_headers && header::ALL.contains(&name);
        if !native && dropped(name) {
            return;
        }
        let Ok(key) = HeaderName::from_bytes(name.as_bytes()) else {
            error = Some(format!(
                "the header name `{}` cannot go in HTTP",
                name.escape_debug()
            ));
            return;
        };
        let Ok(value) = HeaderValue::from_str(value) else {
            error = Some(format!(
                "the value of header `{}` cannot go in HTTP",
                name.escape_debug()
            ));
            return;
        };
        if native {
            map.insert(key, value);
        } else {
            map.entry(key).or_insert(value);
        }
    });
    match error {
        Some(e) => Err(e),
        None => Ok(map),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(map: &HeaderMap, name: &str) -> Vec<String> {
        map.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn every_header_once_with_the_relays_value() {
        let mut m = crate::wire::message::sample(1, "a1");
        for (name, value) in [
            ("Event-Id", "forged"),
            ("Host", "internal.admin.local"),
            ("IDEMPOTENCY-KEY", "x"),
            ("Webhook-Signature", "v1,forged"),
            ("Content-Length", "0"),
            ("Transfer-Encoding", "chunked"),
            ("Proxy-Authorization", "Basic eA=="),
            ("X-Forwarded-Host", "evil"),
            ("Cookie", "session=stolen"),
            ("event_id", "forged"),
            ("X_Forwarded_For", "10.0.0.1"),
            ("content_length", "0"),
            ("X-Tenant", "t1"),
            ("x-tenant", "t2"),
        ] {
            m.headers.insert(name.into(), value.into());
        }
        let map = request_headers(
            [
                (IDEMPOTENCY_KEY, m.message_id.to_string()),
                (WEBHOOK_SIGNATURE, "v1,real".to_owned()),
            ],
            &m,
        )
        .unwrap();
        assert_eq!(names(&map, "event-id"), [m.event_id.to_string()]);
        assert_eq!(names(&map, "idempotency-key"), [m.message_id.to_string()]);
        assert_eq!(names(&map, "webhook-signature"), ["v1,real"]);
        assert_eq!(names(&map, "x-tenant"), ["t1"]);
        assert_eq!(names(&map, "traceparent"), ["00-abc-def-01"]);
        for gone in [
            "host",
            "content-length",
            "transfer-encoding",
            "proxy-authorization",
            "x-forwarded-host",
            "cookie",
            "event_id",
            "x_forwarded_for",
            "content_length",
        ] {
            assert!(names(&map, gone).is_empty(), "{gone}");
        }
    }

    #[test]
    fn a_value_http_cannot_carry_is_an_error_naming_the_header() {
        let mut m = crate::wire::message::sample(1, "a1");
        m.headers.insert("note".into(), "bell\u{7}".into());
        let err = request_headers([], &m).unwrap_err();
        assert!(err.contains("`note`"), "{err}");
    }
}
