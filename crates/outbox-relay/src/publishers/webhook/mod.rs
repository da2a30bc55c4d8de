//! HTTP webhooks: one POST per event. The body is the payload; the event's metadata travels as
//! headers; with a secret, `x-outbox-signature: sha256=<hex>` is an HMAC-SHA256 of the body so
//! the receiver can check it came from this relay. 2xx is the acknowledgement; 408, 429, 5xx,
//! timeouts and connection errors are transient; any other status is permanent.

mod config;
mod publisher;

pub use config::WebhookConfig;
pub use publisher::{sign, WebhookPublisher, SIGNATURE_HEADER};
