//! One folder per broker, and the registry that picks one from a broker URL ([`connect`]).
//! A broker's settings (`config.rs`) are always built, so that a config file reads the same
//! whatever the build; its publisher is behind the broker's cargo feature.

pub mod kafka;
pub mod mqtt;
pub mod nats;
pub mod rabbitmq;
pub mod redis;
pub mod servicebus;
pub mod sqs;
pub mod webhook;

pub mod probe;
mod registry;

pub use registry::{connect, BrokerKind, BrokerSettings};

/// The URL with its secrets hidden, for logs: [`crate::redact::url`].
pub fn redact_url(url: &str) -> String {
    crate::redact::url(url)
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn hides_the_password() {
        assert_eq!(
            redact_url("amqp://guest:s3cret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
        assert_eq!(redact_url("redis://u:p@ss@h:1"), "redis://u:***@h:1");
        assert_eq!(redact_url("amqp://host"), "amqp://host");
    }
}
