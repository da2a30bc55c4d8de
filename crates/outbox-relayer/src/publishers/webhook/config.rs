use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use super::{secret::SigningKey, url_template::UrlTemplate};

/// Webhook settings (`[webhook]` in the config file).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookConfig {
    /// Endpoint (`https://host/path/{destination}`); `{destination}` is replaced by the event's
    /// routed destination, percent-encoded as one path segment (or one query value). It may
    /// appear in the path or the query only, never in the scheme, user info, host or port.
    /// Usually given as `--broker-url`.
    pub url: String,
    /// Standard Webhooks signing secrets (default none: unsigned). Each is `whsec_<base64>` (the
    /// key is the decoded bytes) or any other string (the key is its UTF-8 bytes), at least 24
    /// bytes of key either way. Each request carries one `v1,` signature per secret in
    /// `webhook-signature`, so a receiver can move from an old secret to a new one while both
    /// are listed. One string is read as a list of one (`OUTBOX_WEBHOOK__SECRETS=whsec_…`, or
    /// `[whsec_…, whsec_…]` for several). Never logged.
    #[serde(deserialize_with = "one_or_many")]
    pub secrets: Vec<String>,
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
            .field("secrets", &format_args!("[{} hidden]", self.secrets.len()))
            .field("timeout", &self.timeout)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .finish()
    }
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:8080/events".into(),
            secrets: Vec::new(),
            timeout: Duration::from_secs(10),
            max_payload_bytes: 1024 * 1024,
        }
    }
}

impl WebhookConfig {
    /// Checks the values; the error names the field (and the URL template, which holds no
    /// secret the relay can tell apart from the rest: its password is hidden).
    pub fn validate(&self) -> Result<(), String> {
        UrlTemplate::parse(&self.url)?;
        for (i, secret) in self.secrets.iter().enumerate() {
            SigningKey::parse(secret).map_err(|e| format!("webhook.secrets[{i}]: {e}"))?;
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

/// A list of strings, or one string read as a list of one (what an environment variable
/// holding a single secret gives).
fn one_or_many<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    #[test]
    fn debug_hides_the_secrets_and_errors_name_the_field() {
        let c = WebhookConfig {
            secrets: vec![SECRET.into()],
            ..Default::default()
        };
        assert!(!format!("{c:?}").contains("C2FV"));
        let c = WebhookConfig {
            url: "ftp://x".into(),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().starts_with("webhook.url"));
        let c = WebhookConfig {
            secrets: vec![SECRET.into(), "short".into()],
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().starts_with("webhook.secrets[1]"));
    }

    #[test]
    fn one_secret_reads_as_a_list_of_one() {
        let one: WebhookConfig =
            serde_json::from_value(serde_json::json!({ "secrets": SECRET })).unwrap();
        let many: WebhookConfig =
            serde_json::from_value(serde_json::json!({ "secrets": [SECRET, SECRET] })).unwrap();
        assert_eq!(one.secrets, vec![SECRET]);
        assert_eq!(many.secrets.len(), 2);
        assert!(
            serde_json::from_value::<WebhookConfig>(serde_json::json!({ "secret": SECRET }))
                .is_err()
        );
    }
}
