use std::time::Duration;

use serde::{Deserialize, Serialize};

/// MQTT settings (`[mqtt]` in the config file).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttConfig {
    /// Broker URL (`mqtt://[user:password@]host:1883`, `mqtts://host:8883` for TLS); usually
    /// given as `--broker-url`. The password is never logged.
    pub url: String,
    /// Client id prefix; each connection adds a unique suffix (default `outbox-relay`).
    pub client_id: String,
    /// Connections, so publishes, in flight at once (default 8).
    pub connections: usize,
    /// Treat a PUBACK saying "no matching subscribers" as a permanent failure (default true):
    /// the broker would drop the message.
    pub require_subscribers: bool,
    /// Publish with the retain flag (default false).
    pub retain: bool,
    /// Give up connecting after this long (default 5s); the attempt is transient.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Wait for the PUBACK at most this long (default 10s); then the attempt is transient.
    #[serde(with = "humantime_serde")]
    pub ack_timeout: Duration,
    /// Keep-alive interval (default 30s).
    #[serde(with = "humantime_serde")]
    pub keep_alive: Duration,
    /// Largest payload published (default 1 MiB; MQTT allows 256 MB, brokers often less).
    pub max_payload_bytes: usize,
    /// Topic prefixes an event may be published to (default none: any topic but the
    /// broker's own). A prefix matches as written (`shop/` allows `shop/orders`). `$` topics
    /// (`$SYS/…`) stay refused whatever this allows.
    pub topic_prefixes: Vec<String>,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            url: "mqtt://127.0.0.1:1883".into(),
            client_id: "outbox-relay".into(),
            connections: 8,
            require_subscribers: true,
            retain: false,
            connect_timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(30),
            max_payload_bytes: 1024 * 1024,
            topic_prefixes: Vec::new(),
        }
    }
}

impl std::fmt::Debug for MqttConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttConfig")
            .field("url", &crate::publishers::redact_url(&self.url))
            .field("client_id", &self.client_id)
            .field("connections", &self.connections)
            .field("require_subscribers", &self.require_subscribers)
            .field("retain", &self.retain)
            .field("connect_timeout", &self.connect_timeout)
            .field("ack_timeout", &self.ack_timeout)
            .field("keep_alive", &self.keep_alive)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("topic_prefixes", &self.topic_prefixes)
            .finish()
    }
}

/// Where and how to connect, read from [`MqttConfig::url`].
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: bool,
    pub credentials: Option<(String, String)>,
}

impl MqttConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        self.endpoint()?;
        let id_ok = !self.client_id.is_empty()
            && self.client_id.len() <= 40
            && self
                .client_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !id_ok {
            return Err(
                "mqtt.client_id: 1 to 40 letters, digits, '-' or '_' (a suffix is added)".into(),
            );
        }
        if self.connections == 0 || self.connections > 1024 {
            return Err("mqtt.connections: must be between 1 and 1024".into());
        }
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("ack_timeout", self.ack_timeout),
            ("keep_alive", self.keep_alive),
        ] {
            if value < Duration::from_secs(1) {
                return Err(format!("mqtt.{name}: must be at least 1s"));
            }
        }
        if self.max_payload_bytes == 0 || self.max_payload_bytes > 256 * 1024 * 1024 {
            return Err("mqtt.max_payload_bytes: must be between 1 and 256 MiB".into());
        }
        if let Some(bad) = self
            .topic_prefixes
            .iter()
            .find(|p| p.is_empty() || p.starts_with('$') || p.contains(['+', '#', '\0']))
        {
            return Err(format!(
                "mqtt.topic_prefixes: {bad:?} must be non-empty, not start with '$' and hold no \
                 wildcard or NUL"
            ));
        }
        Ok(())
    }

    pub(crate) fn endpoint(&self) -> Result<Endpoint, String> {
        let (tls, rest) = if let Some(rest) = self.url.strip_prefix("mqtt://") {
            (false, rest)
        } else if let Some(rest) = self.url.strip_prefix("mqtts://") {
            (true, rest)
        } else {
            return Err("mqtt.url: must start with mqtt:// or mqtts://".into());
        };
        let rest = rest.trim_end_matches('/');
        let (credentials, hostport) = match rest.rsplit_once('@') {
            Some((userinfo, hostport)) => {
                let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                (Some((user.to_owned(), password.to_owned())), hostport)
            }
            None => (None, rest),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((host, port)) => (
                host,
                port.parse::<u16>()
                    .map_err(|_| format!("mqtt.url: port {port:?} is not a number"))?,
            ),
            None => (hostport, if tls { 8883 } else { 1883 }),
        };
        if host.is_empty() || host.contains('/') {
            return Err("mqtt.url: no host (mqtt://host:1883)".into());
        }
        Ok(Endpoint {
            host: host.to_owned(),
            port,
            tls,
            credentials,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_url() {
        let c = MqttConfig {
            url: "mqtts://app:p@ss@broker:8884".into(),
            ..Default::default()
        };
        let e = c.endpoint().unwrap();
        assert_eq!((e.host.as_str(), e.port, e.tls), ("broker", 8884, true));
        assert_eq!(e.credentials, Some(("app".into(), "p@ss".into())));
        let e = MqttConfig::default().endpoint().unwrap();
        assert_eq!((e.port, e.tls, e.credentials), (1883, false, None));
    }

    #[test]
    fn errors_name_the_field() {
        let bad = |c: MqttConfig| c.validate().unwrap_err();
        assert!(bad(MqttConfig {
            url: "tcp://x".into(),
            ..Default::default()
        })
        .starts_with("mqtt.url"));
        assert!(bad(MqttConfig {
            url: "mqtt://x:port".into(),
            ..Default::default()
        })
        .contains("not a number"));
        assert!(bad(MqttConfig {
            connections: 0,
            ..Default::default()
        })
        .starts_with("mqtt.connections"));
        assert!(bad(MqttConfig {
            client_id: "a b".into(),
            ..Default::default()
        })
        .starts_with("mqtt.client_id"));
    }

    #[test]
    fn debug_hides_the_password() {
        let c = MqttConfig {
            url: "mqtt://app:s3cret@broker:1883".into(),
            ..Default::default()
        };
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
