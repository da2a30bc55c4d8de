//! One folder per broker, each behind its cargo feature.

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "mqtt")]
pub mod mqtt;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "servicebus")]
pub mod servicebus;
#[cfg(feature = "sqs")]
pub mod sqs;
#[cfg(feature = "webhook")]
pub mod webhook;

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
