use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Webhook settings (`[webhook]` in the config file).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookConfig {
    /// Endpoint (`https://host/path`); `{destination}` in it is replaced by the event's routed
    /// destination. Usually given as `--broker-url`.
    pub url: String,
    /// HMAC-SHA256 key for `x-outbox-signature` (default none: unsigned). Never logged.
    pub secret: Option<String>,
    /// Whole-request timeout (default 10s); a timeout is transient.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Largest body sent (default 1 MiB).
    pub max_payload_bytes: usize,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &self.url)
            .field("secret", &self.secret.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .finish()
    }
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:8080/events".into(),
            secret: None,
            timeout: Duration::from_secs(10),
            max_payload_bytes: 1024 * 1024,
        }
    }
}

impl WebhookConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err("webhook.url: must start with http:// or https://".into());
        }
        if self.secret.as_deref() == Some("") {
            return Err("webhook.secret: must not be empty when set".into());
        }
        if self.timeout.is_zero() {
            return Err("webhook.timeout: must be more than 0".into());
        }
        if self.max_payload_bytes == 0 {
            return Err("webhook.max_payload_bytes: must be more than 0".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_secret_and_errors_name_the_field() {
        let c = WebhookConfig {
            secret: Some("hunter2".into()),
            ..Default::default()
        };
        assert!(!format!("{c:?}").contains("hunter2"));
        let c = WebhookConfig {
            url: "ftp://x".into(),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().starts_with("webhook.url"));
    }
}
