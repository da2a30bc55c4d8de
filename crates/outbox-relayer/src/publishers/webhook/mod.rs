//! HTTP webhooks: one POST per event, signed per Standard Webhooks
//! (<https://www.standardwebhooks.com/>). The body is the payload; the event's metadata travels
//! as headers; `webhook-id` (the message id), `webhook-timestamp` (send time) and, with secrets,
//! `webhook-signature` (`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, one per secret)
//! let the receiver check who sent it and refuse a replay (`outbox_consumer::webhook`). 2xx is
//! the acknowledgement; 408, 429, 5xx, timeouts and connection errors are transient; any other
//! status, 3xx included (redirects are never followed), is permanent.
//!
//! Event data is untrusted: the destination is encoded into one path segment
//! (`url_template.rs`) and the writer's headers cannot override the relay's or the transport's
//! (`headers.rs`).

// Parts only its publisher uses are dead in a build without it.
#[cfg_attr(not(feature = "webhook"), allow(dead_code))]
mod config;
#[cfg(feature = "webhook")]
mod headers;
#[cfg(feature = "webhook")]
mod publisher;
#[cfg_attr(not(feature = "webhook"), allow(dead_code))]
mod secret;
#[cfg_attr(not(feature = "webhook"), allow(dead_code))]
mod url_template;

pub use config::WebhookConfig;
#[cfg(feature = "webhook")]
pub use publisher::WebhookPublisher;
#[cfg(feature = "webhook")]
pub use secret::sign;
