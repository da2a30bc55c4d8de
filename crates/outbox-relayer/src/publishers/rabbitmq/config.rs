use std::time::Duration;

use serde::{Deserialize, Serialize};

/// RabbitMQ settings (`[rabbitmq]` in the config file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RabbitMqConfig {
    /// Broker URL (`amqp://user:pass@host:5672/vhost`); usually given as `--broker-url`.
    pub url: String,
    /// Exchange events are published to (default `outbox`); the destination is the routing key.
    pub exchange: String,
    /// Declare the exchange as a durable topic exchange at start-up (default true).
    pub declare_exchange: bool,
    /// Largest message accepted (default 16 MiB, RabbitMQ 4's default `max_message_size`).
    pub max_payload_bytes: usize,
    /// Channels, so publishes awaiting their confirm, at once (default 256; each channel
    /// carries one outstanding publish so a `basic.return` is never attributed to another
    /// message). More channels help when confirms are slow (persistent messages, fsync).
    pub channels: usize,
    /// Give up connecting after this long; the next publish tries again (default 5s).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Routing-key prefixes an event may be published with (default none: any key of at most
    /// 255 bytes). A prefix matches as written (`orders.` allows `orders.placed`). With the
    /// default exchange (`exchange = ""`) the routing key is a queue name, so this is the list
    /// of queues events may reach; `amq.` queues stay refused whatever it allows.
    pub routing_key_prefixes: Vec<String>,
}

impl Default for RabbitMqConfig {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            exchange: "outbox".into(),
            declare_exchange: true,
            max_payload_bytes: 16 * 1024 * 1024,
            channels: 256,
            connect_timeout: Duration::from_secs(5),
            routing_key_prefixes: Vec::new(),
        }
    }
}

impl RabbitMqConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.url.starts_with("amqp://") || self.url.starts_with("amqps://")) {
            return Err("rabbitmq.url: must start with amqp:// or amqps://".into());
        }
        if self.exchange.len() > 255 || self.exchange.chars().any(char::is_control) {
            return Err("rabbitmq.exchange: must be at most 255 printable bytes".into());
        }
        if self.max_payload_bytes == 0 {
            return Err("rabbitmq.max_payload_bytes: must be more than 0".into());
        }
        if self.channels == 0 || self.channels > 2047 {
            return Err("rabbitmq.channels: must be between 1 and 2047".into());
        }
        if self.connect_timeout.is_zero() {
            return Err("rabbitmq.connect_timeout: must be more than 0".into());
        }
        if let Some(bad) = self
            .routing_key_prefixes
            .iter()
            .find(|p| p.is_empty() || p.len() > 255)
        {
            return Err(format!(
                "rabbitmq.routing_key_prefixes: {bad:?} must be 1 to 255 bytes"
            ));
        }
        Ok(())
    }

    /// The URL with its password hidden, for logs.
    pub fn redacted_url(&self) -> String {
        crate::publishers::redact_url(&self.url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field() {
        let c = RabbitMqConfig {
            url: "nats://x".into(),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().starts_with("rabbitmq.url"));
    }
}
