//! HTTP webhooks: one POST per event. The body is the payload; the event's metadata travels as
//! headers; with a secret, `x-outbox-signature: sha256=<hex>` is an HMAC-SHA256 of the body so
//! the receiver can check it came from this relay. 2xx is the acknowledgement; 408, 429, 5xx,
//! timeouts and connection errors are transient; any other status is permanent.

// Parts only its publisher uses are dead in a build without it.
#[cfg_attr(not(feature = "webhook"), allow(dead_code))]
mod config;
#[cfg(feature = "webhook")]
mod publisher;

pub use config::WebhookConfig;
#[cfg(feature = "webhook")]
pub use publisher::{sign, WebhookPublisher, SIGNATURE_HEADER};
