use std::time::Duration;

use serde::{Deserialize, Serialize};

/// SQS's own ceiling on a message's size (body plus attributes) when a queue is configured for
/// it; the default queue limit is 256 KiB.
pub const SQS_MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// Room the payload leaves for the message attributes (metadata) within `max_message_bytes`.
pub const ATTRIBUTE_ROOM: usize = 8 * 1024;

/// AWS SQS settings (`[sqs]` in the config file).
///
/// Credentials are never part of this configuration: they come from the standard AWS chain
/// (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, the shared profile files
/// and `AWS_PROFILE`, web identity, ECS and EC2 instance metadata), and are never logged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SqsConfig {
    /// AWS region (`eu-west-1`). Default empty: the standard chain's region (`AWS_REGION`, the
    /// profile, instance metadata), or `us-east-1` when `endpoint_url` points at an emulator.
    /// `sqs://REGION` as the broker URL sets it.
    pub region: String,
    /// Endpoint to send requests to instead of AWS's (an emulator such as moto or LocalStack:
    /// `http://127.0.0.1:4566`). Default empty: AWS's endpoint for the region.
    /// `sqs+http://host:port` or `sqs+https://host` as the broker URL sets it.
    pub endpoint_url: String,
    /// How long a publish waits for others to the same queue before their `SendMessageBatch`
    /// goes out (default 5ms); a batch also goes out as soon as it has 10 entries. 0 sends
    /// whatever is waiting at once.
    #[serde(with = "humantime_serde")]
    pub batch_linger: Duration,
    /// Bound on one SQS request including the SDK's retries (default 10s; at most 3 attempts,
    /// connect timeout 3s); then the publish fails as transient.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// SQS's limit for one message, body plus attributes, which is also the limit of one batch
    /// (default 262144, 256 KiB; up to 1048576 for queues configured so). Payloads may use this
    /// less 8 KiB kept for the attributes.
    pub max_message_bytes: usize,
    /// AWS account ids whose queues a destination may name by queue URL (default none: a
    /// destination must be a queue name, resolved in the relay's own account). A queue URL
    /// must also be on the endpoint in use (`endpoint_url`, else `sqs.REGION.amazonaws.com`
    /// of the region in use).
    pub queue_url_accounts: Vec<String>,
    /// Queue name prefixes an event may be sent to, by name or URL (default none: any queue
    /// the other rules allow). A prefix matches as written (`orders-` allows
    /// `orders-placed.fifo`).
    pub queue_prefixes: Vec<String>,
}

impl Default for SqsConfig {
    fn default() -> Self {
        Self {
            region: String::new(),
            endpoint_url: String::new(),
            batch_linger: Duration::from_millis(5),
            request_timeout: Duration::from_secs(10),
            max_message_bytes: 256 * 1024,
            queue_url_accounts: Vec::new(),
            queue_prefixes: Vec::new(),
        }
    }
}

impl SqsConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let region_ok = self
            .region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !region_ok || self.region.len() > 64 {
            return Err(format!(
                "sqs.region: {:?} is not a region name (lowercase letters, digits and '-', such \
                 as eu-west-1)",
                self.region
            ));
        }
        if !self.endpoint_url.is_empty() {
            let host = self
                .endpoint_url
                .strip_prefix("http://")
                .or_else(|| self.endpoint_url.strip_prefix("https://"));
            if host.is_none_or(|h| h.is_empty() || h.starts_with('/')) {
                return Err(format!(
                    "sqs.endpoint_url: {:?} must be http://host[:port] or https://host[:port]",
                    self.endpoint_url
                ));
            }
        }
        if self.batch_linger > Duration::from_secs(1) {
            return Err("sqs.batch_linger: must be at most 1s (it delays every publish)".into());
        }
        if self.request_timeout.is_zero() {
            return Err("sqs.request_timeout: must be more than 0".into());
        }
        if !(2 * ATTRIBUTE_ROOM..=SQS_MAX_MESSAGE_BYTES).contains(&self.max_message_bytes) {
            return Err(format!(
                "sqs.max_message_bytes: must be between {} and {SQS_MAX_MESSAGE_BYTES}",
                2 * ATTRIBUTE_ROOM
            ));
        }
        if let Some(bad) = self
            .queue_url_accounts
            .iter()
            .find(|a| a.len() != 12 || !a.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(format!(
                "sqs.queue_url_accounts: {bad:?} is not an AWS account id (12 digits)"
            ));
        }
        if self.queue_prefixes.iter().any(String::is_empty) {
            return Err("sqs.queue_prefixes: a prefix must not be empty".into());
        }
        Ok(())
    }

    /// Applies a broker URL: `sqs://REGION` (AWS; `sqs://` alone keeps the configured or
    /// standard-chain region), `sqs+http://host:port` or `sqs+https://host[:port]` (an endpoint
    /// such as an emulator's). The error says what is wrong with the URL.
    pub fn apply_broker_url(&mut self, url: &str) -> Result<(), String> {
        if let Some(region) = url.strip_prefix("sqs://") {
            let region = region.trim_end_matches('/');
            if !region.is_empty() {
                self.region = region.to_owned();
            }
        } else if let Some(rest) = url.strip_prefix("sqs+") {
            if !(rest.starts_with("http://") || rest.starts_with("https://")) {
                return Err(format!(
                    "broker URL {url:?}: use sqs://REGION, sqs+http://host:port or \
                     sqs+https://host",
                    url = crate::redact::url(url)
                ));
            }
            self.endpoint_url = rest.trim_end_matches('/').to_owned();
        } else {
            return Err(format!(
                "broker URL {url:?} is not an SQS URL (sqs://REGION, sqs+http://host:port, \
                 sqs+https://host)",
                url = crate::redact::url(url)
            ));
        }
        self.validate()
            .map_err(|e| format!("broker URL {:?}: {e}", crate::redact::url(url)))
    }

    /// Largest payload accepted: `max_message_bytes` less the room kept for the attributes.
    pub fn max_payload_bytes(&self) -> usize {
        self.max_message_bytes - ATTRIBUTE_ROOM
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        SqsConfig::default().validate().unwrap();
        assert_eq!(SqsConfig::default().max_payload_bytes(), 248 * 1024);
    }

    #[test]
    fn errors_name_the_field() {
        let bad = [
            (
                SqsConfig {
                    region: "EU west".into(),
                    ..Default::default()
                },
                "sqs.region",
            ),
            (
                SqsConfig {
                    endpoint_url: "localhost:4566".into(),
                    ..Default::default()
                },
                "sqs.endpoint_url",
            ),
            (
                SqsConfig {
                    batch_linger: Duration::from_secs(2),
                    ..Default::default()
                },
                "sqs.batch_linger",
            ),
            (
                SqsConfig {
                    request_timeout: Duration::ZERO,
                    ..Default::default()
                },
                "sqs.request_timeout",
            ),
            (
                SqsConfig {
                    max_message_bytes: 2 * 1024 * 1024,
                    ..Default::default()
                },
                "sqs.max_message_bytes",
            ),
        ];
        for (config, field) in bad {
            let error = config.validate().unwrap_err();
            assert!(error.starts_with(field), "{error}");
        }
    }

    #[test]
    fn broker_urls_set_region_or_endpoint() {
        let mut c = SqsConfig::default();
        c.apply_broker_url("sqs://eu-west-1").unwrap();
        assert_eq!(c.region, "eu-west-1");
        assert_eq!(c.endpoint_url, "");
        let mut c = SqsConfig::default();
        c.apply_broker_url("sqs+http://127.0.0.1:4566/").unwrap();
        assert_eq!(c.endpoint_url, "http://127.0.0.1:4566");
        let mut c = SqsConfig::default();
        c.apply_broker_url("sqs+https://sqs.example.com").unwrap();
        assert_eq!(c.endpoint_url, "https://sqs.example.com");
        for bad in [
            "http://x",
            "sqs+ftp://x",
            "sqs://Not A Region",
            "sqs+http://",
        ] {
            let error = SqsConfig::default().apply_broker_url(bad).unwrap_err();
            assert!(error.contains(bad), "{error}");
        }
    }
}
