use std::time::Duration;

use serde::{Deserialize, Serialize};

/// NATS JetStream settings (`[nats]` in the config file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// Server URL (`nats://host:4222`); usually given as `--broker-url`.
    pub url: String,
    /// Stream the relay publishes into (default `OUTBOX`).
    pub stream: String,
    /// Create the stream, and add subjects to it, when a publish finds no stream for its
    /// subject (default true). When false, such events fail permanently.
    pub create_stream: bool,
    /// Wait for the PubAck at most this long (default 10s); then the attempt is transient.
    #[serde(with = "humantime_serde")]
    pub ack_timeout: Duration,
    /// Subject prefixes an event may be published to (default none: any subject but the
    /// server's own). A prefix matches as written (`orders.` allows `orders.placed`, not
    /// `orders_admin.x`). System and API subjects (`$…`, `_INBOX.…`) stay refused whatever
    /// this allows.
    pub subject_prefixes: Vec<String>,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            stream: "OUTBOX".into(),
            create_stream: true,
            ack_timeout: Duration::from_secs(10),
            subject_prefixes: Vec::new(),
        }
    }
}

impl NatsConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.url.starts_with("nats://") || self.url.starts_with("tls://")) {
            return Err("nats.url: must start with nats:// or tls://".into());
        }
        let ok = !self.stream.is_empty()
            && self
                .stream
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            return Err("nats.stream: must be letters, digits, '_' or '-'".into());
        }
        if self.ack_timeout.is_zero() {
            return Err("nats.ack_timeout: must be more than 0".into());
        }
        for prefix in &self.subject_prefixes {
            if prefix.is_empty() || prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "nats.subject_prefixes: {prefix:?} must be non-empty, without whitespace"
                ));
            }
            if let Some(rule) = super::subjects::system_subject_rule(prefix) {
                return Err(format!(
                    "nats.subject_prefixes: {prefix:?} names the server's own subjects ({rule})"
                ));
            }
        }
        Ok(())
    }
}
