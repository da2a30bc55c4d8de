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

/// Replaces the password in `scheme://user:password@host…` with `***`, for logs. The last `@`
/// ends the user info, so a password containing `@` is hidden whole.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
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
