//! The config file (TOML), environment overrides and command-line flags, merged in that order
//! of precedence: flags > `OUTBOX_*` environment > file > defaults. Unknown keys are rejected
//! and every error names the key.

use std::{net::SocketAddr, num::NonZeroUsize, path::Path};

use figment::{
    providers::{Env, Format, Serialized, Toml},
    Figment,
};
use outbox_relayer::{
    publishers::{
        kafka::KafkaConfig, mqtt::MqttConfig, nats::NatsConfig, rabbitmq::RabbitMqConfig,
        redis::RedisConfig, servicebus::ServiceBusConfig, sqs::SqsConfig, webhook::WebhookConfig,
        BrokerSettings,
    },
    RelayConfig,
};
use serde::{Deserialize, Serialize};

use crate::logging::LogFormat;

/// Everything `outbox relay` reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    /// PostgreSQL URL (`postgres://user@host/db`).
    pub database_url: Option<String>,
    /// Broker URL: `nats://…`, `amqp://…`, `redis://…`, `mqtt://…`, `sqs://REGION` /
    /// `sqs+http(s)://host:port` (SQS), `http(s)://…` (webhook), `sb://…` or an Azure
    /// connection string (Service Bus), `amqp1://…` / `amqps1://…` (any AMQP 1.0 broker),
    /// `kafka://…`.
    pub broker_url: Option<String>,
    /// Address of the dashboard, its API, and (unless `metrics_listen` is set) `/metrics`,
    /// `/healthz` and `/readyz` (default `127.0.0.1:9187`). Beyond loopback, the API's reads
    /// need `read_token` or `admin_token`, and are refused when neither is set.
    pub listen: SocketAddr,
    /// A listener of their own for `/metrics`, `/healthz` and `/readyz` (default: none, they
    /// are served on `listen`), so that probes and scrapers reach them while the dashboard
    /// stays on loopback. When set, `listen` serves only the dashboard and its API.
    pub metrics_listen: Option<SocketAddr>,
    /// `Host` names the dashboard and its API answer besides `localhost`, `127.0.0.1`,
    /// `[::1]` and the listen address (default none): `name` on any port, `name:port` on
    /// that one. Other hosts get 421 (DNS rebinding). `/metrics`, `/healthz`, `/readyz`
    /// answer any host.
    pub allowed_hosts: Vec<String>,
    /// `text` (default) or `json`.
    pub log_format: LogFormatSetting,
    /// Threads of `outbox relay`'s async runtime (default 1; at least 1). One thread serves
    /// a relay whose limit is its database or broker, and spends the least CPU per event;
    /// more let a relay use more than one core.
    pub worker_threads: NonZeroUsize,
    /// Bearer token for the dashboard's mutating actions (replay, skip); without one the
    /// dashboard is read-only. Prefer `OUTBOX_ADMIN_TOKEN` to a file. Never logged. Also
    /// accepted for reads.
    pub admin_token: Option<String>,
    /// Bearer token for the dashboard's reads (`/api/status`, `/api/dead-letters`). When set,
    /// reads need it (or the admin token) even on loopback; unset, reads are open on loopback
    /// and need the admin token beyond it. Prefer `OUTBOX_READ_TOKEN`. Never logged.
    pub read_token: Option<String>,
    /// Relay settings.
    pub relay: RelayConfig,
    /// NATS JetStream settings.
    pub nats: NatsConfig,
    /// RabbitMQ settings.
    pub rabbitmq: RabbitMqConfig,
    /// HTTP webhook settings.
    pub webhook: WebhookConfig,
    /// Redis Streams settings.
    pub redis: RedisConfig,
    /// MQTT settings.
    pub mqtt: MqttConfig,
    /// AWS SQS settings (credentials come from the standard AWS chain, never from here).
    pub sqs: SqsConfig,
    /// AMQP 1.0 / Azure Service Bus settings.
    pub servicebus: ServiceBusConfig,
    /// Kafka settings.
    pub kafka: KafkaConfig,
}

impl FileConfig {
    /// The publishers' settings, for `outbox_relayer::publishers::connect`.
    pub fn broker_settings(&self) -> BrokerSettings {
        let mut settings = BrokerSettings::default();
        settings.nats = self.nats.clone();
        settings.rabbitmq = self.rabbitmq.clone();
        settings.webhook = self.webhook.clone();
        settings.redis = self.redis.clone();
        settings.mqtt = self.mqtt.clone();
        settings.sqs = self.sqs.clone();
        settings.servicebus = self.servicebus.clone();
        settings.kafka = self.kafka.clone();
        settings
    }
}

/// Serde-friendly wrapper of [`LogFormat`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormatSetting {
    /// Human-readable lines.
    #[default]
    Text,
    /// JSON lines.
    Json,
}

impl From<LogFormatSetting> for LogFormat {
    fn from(value: LogFormatSetting) -> Self {
        match value {
            LogFormatSetting::Text => LogFormat::Text,
            LogFormatSetting::Json => LogFormat::Json,
        }
    }
}

impl Default for FileConfig {
    fn default() -> Self {
        Self {
            database_url: None,
            broker_url: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 9187)),
            metrics_listen: None,
            allowed_hosts: Vec::new(),
            log_format: LogFormatSetting::Text,
            worker_threads: NonZeroUsize::MIN,
            admin_token: None,
            read_token: None,
            relay: RelayConfig::default(),
            nats: NatsConfig::default(),
            rabbitmq: RabbitMqConfig::default(),
            webhook: WebhookConfig::default(),
            redis: RedisConfig::default(),
            mqtt: MqttConfig::default(),
            sqs: SqsConfig::default(),
            servicebus: ServiceBusConfig::default(),
            kafka: KafkaConfig::default(),
        }
    }
}

/// Top-level keys of the file, the only ones `OUTBOX_*` variables may set.
const KEYS: &[&str] = &[
    "database_url",
    "broker_url",
    "listen",
    "metrics_listen",
    "allowed_hosts",
    "log_format",
    "worker_threads",
    "admin_token",
    "read_token",
    "relay",
    "nats",
    "rabbitmq",
    "webhook",
    "redis",
    "mqtt",
    "sqs",
    "servicebus",
    "kafka",
];

/// Loads defaults, then the file (if any), then `OUTBOX_*` variables (`OUTBOX_DATABASE_URL`,
/// `OUTBOX_RELAY__MAX_BATCH_SIZE`: `__` separates nesting levels).
pub fn load(path: Option<&Path>) -> Result<FileConfig, String> {
    let mut figment = Figment::from(Serialized::defaults(FileConfig::default()));
    if let Some(path) = path {
        if !path.exists() {
            return Err(format!("config file {} does not exist", path.display()));
        }
        figment = figment.merge(Toml::file_exact(path));
    }
    // Only variables naming a key of this file are read: other tools (and the test suite's
    // OUTBOX_TEST_DATABASE_URL) share the prefix and must not be rejected as unknown keys.
    figment = figment.merge(Env::prefixed("OUTBOX_").split("__").filter(|key| {
        let first = key.as_str().split('.').next().unwrap_or_default();
        KEYS.iter().any(|k| k.eq_ignore_ascii_case(first))
    }));
    figment.extract().map_err(|e| {
        e.into_iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    })
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    pub(super) fn write(text: &str) -> tempfile_path::TempPath {
        tempfile_path::TempPath::with(text)
    }

    /// A tiny temp-file helper (std only).
    pub(super) mod tempfile_path {
        use super::Write;
        pub struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub fn with(text: &str) -> Self {
                let path = std::env::temp_dir().join(format!(
                    "outbox-config-{}-{}.toml",
                    std::process::id(),
                    rand::random::<u64>()
                ));
                std::fs::File::create(&path)
                    .unwrap()
                    .write_all(text.as_bytes())
                    .unwrap();
                Self(path)
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn reads_a_full_file() {
        let f = write(
            r#"
            database_url = "postgres://localhost/db"
            broker_url = "nats://localhost:4222"
            listen = "127.0.0.1:9999"
            log_format = "json"
            [relay]
            max_batch_size = 500
            poll_interval = "250ms"
            on_dead = "skip"
            [relay.retry]
            max_attempts = 3
            [[relay.routing.rules]]
            event_type = "OrderPaid"
            destination = "payments"
            [nats]
            stream = "EVENTS"
            [sqs]
            region = "eu-west-1"
            batch_linger = "2ms"
            "#,
        );
        let c = load(Some(&f.0)).unwrap();
        assert_eq!(c.relay.max_batch_size, 500);
        assert_eq!(c.relay.poll_interval, std::time::Duration::from_millis(250));
        assert_eq!(c.relay.retry.max_attempts, 3);
        assert_eq!(c.relay.routing.rules[0].destination, "payments");
        assert_eq!(c.nats.stream, "EVENTS");
        assert_eq!(c.sqs.region, "eu-west-1");
        assert_eq!(c.sqs.batch_linger, std::time::Duration::from_millis(2));
        assert_eq!(c.listen.port(), 9999);
    }

    #[test]
    fn reads_the_servicebus_section() {
        let f = write(
            r#"
            [servicebus]
            connection_string = "amqp1://guest:guest@localhost:5672"
            address = "/exchange/events/{destination}"
            ack_timeout = "3s"
            max_payload_bytes = 1048576
            "#,
        );
        let c = load(Some(&f.0)).unwrap();
        assert_eq!(
            c.servicebus.address.as_deref(),
            Some("/exchange/events/{destination}")
        );
        assert_eq!(c.servicebus.ack_timeout, std::time::Duration::from_secs(3));
        assert_eq!(c.servicebus.max_payload_bytes, 1024 * 1024);
        assert!(c.servicebus.validate().is_ok());
        let f = write("[servicebus]\nack_timout = \"3s\"\n");
        let err = load(Some(&f.0)).unwrap_err();
        assert!(err.contains("ack_timout"), "{err}");
    }

    #[test]
    fn reads_the_kafka_section() {
        let f = write(
            r#"
            broker_url = "kafka://k1:9092,k2:9092"
            [kafka]
            client_id = "orders-relay"
            security_protocol = "sasl_ssl"
            sasl_mechanism = "SCRAM-SHA-512"
            sasl_username = "relay"
            sasl_password = "s3cret"
            message_timeout = "5s"
            compression = "lz4"
            [kafka.properties]
            "linger.ms" = 20
            "ssl.ca.location" = "/etc/ssl/ca.pem"
            "#,
        );
        let c = load(Some(&f.0)).unwrap();
        c.kafka.validate().unwrap();
        assert_eq!(c.kafka.client_id, "orders-relay");
        assert_eq!(c.kafka.message_timeout, std::time::Duration::from_secs(5));
        assert_eq!(c.kafka.properties["linger.ms"], "20");
        assert!(!format!("{c:?}").contains("s3cret"));
        let f = write("[kafka]\ncompression = \"zstd\"\n");
        let err = load(Some(&f.0)).unwrap_err();
        assert!(err.contains("compression"), "{err}");
        let f = write("[kafka]\nbrokerz = \"x:1\"\n");
        let err = load(Some(&f.0)).unwrap_err();
        assert!(err.contains("brokerz"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let f = write("[relay]\nmax_batch_sise = 10\n");
        let err = load(Some(&f.0)).unwrap_err();
        assert!(err.contains("max_batch_sise"), "{err}");
        let f = write("[relay]\npoll_interval = \"soon\"\n");
        let err = load(Some(&f.0)).unwrap_err();
        assert!(err.contains("poll_interval"), "{err}");
        let f = write("listen = \"nowhere\"\n");
        let err = load(Some(&f.0)).unwrap_err();
        assert!(err.contains("listen"), "{err}");
        let f = write("[sqs]\naccess_key = \"x\"\n");
        let err = load(Some(&f.0)).unwrap_err();
        assert!(err.contains("access_key"), "{err}");
        let err = load(Some(Path::new("/nonexistent/outbox.toml"))).unwrap_err();
        assert!(err.contains("does not exist"), "{err}");
    }
}
