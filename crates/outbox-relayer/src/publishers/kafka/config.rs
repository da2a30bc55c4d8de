use std::{collections::BTreeMap, fmt, time::Duration};

use serde::{Deserialize, Deserializer, Serialize};

/// Kafka settings (`[kafka]` in the config file).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port` separated by commas (default `127.0.0.1:9092`); usually
    /// given as `--broker-url kafka://host:port[,host:port]`.
    pub brokers: String,
    /// `client.id` the brokers see in their logs and quotas (default `outbox-relay`).
    pub client_id: String,
    /// `plaintext` (default), `ssl`, `sasl_plaintext` or `sasl_ssl`.
    pub security_protocol: SecurityProtocol,
    /// SASL mechanism, required with the `sasl_*` protocols: `PLAIN`, `SCRAM-SHA-256` or
    /// `SCRAM-SHA-512` (default none).
    pub sasl_mechanism: Option<SaslMechanism>,
    /// SASL user name, required with the `sasl_*` protocols (default none).
    pub sasl_username: Option<String>,
    /// SASL password, required with the `sasl_*` protocols (default none). Prefer
    /// `OUTBOX_KAFKA__SASL_PASSWORD` to a file. Never logged, hidden from `Debug`.
    pub sasl_password: Option<String>,
    /// How long librdkafka may try to deliver one message, retries included
    /// (`message.timeout.ms`, default 10s). When it runs out the publish fails as transient,
    /// so an unreachable cluster is reported within this time.
    #[serde(with = "humantime_serde")]
    pub message_timeout: Duration,
    /// Largest payload accepted (default 1 MiB, Kafka's default `message.max.bytes`). The key
    /// and headers travel in the same record, so the broker's limit is reached slightly
    /// earlier; the broker's refusal is permanent too.
    pub max_payload_bytes: usize,
    /// Compression of record batches: `none` (default), `gzip`, `snappy` or `lz4`.
    pub compression: Compression,
    /// Let the broker create a topic on the first publish to it, where the broker allows it
    /// (`allow.auto.create.topics`, default false). When false a publish to a missing topic
    /// fails as permanent, like an unroutable message.
    pub allow_auto_create_topics: bool,
    /// Extra librdkafka producer settings (`"linger.ms" = 10`, `"ssl.ca.location" = "…"`),
    /// applied after the relay's own. Settings that would weaken the guarantees
    /// (`enable.idempotence`, `acks` other than `all`, `max.in.flight` over 5, transactions)
    /// and settings that have a field above are refused.
    #[serde(deserialize_with = "scalar_map")]
    pub properties: BTreeMap<String, String>,
    /// Topic prefixes an event may be published to (default none: any legal topic but the
    /// internal ones). A prefix matches as written (`orders.` allows `orders.placed`).
    /// Internal topics (`__consumer_offsets`, `__transaction_state`, any `__…`) stay refused
    /// whatever this allows.
    pub topic_prefixes: Vec<String>,
}

/// `security.protocol`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    /// No TLS, no authentication.
    #[default]
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL authentication without TLS.
    SaslPlaintext,
    /// SASL authentication over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// The librdkafka value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }

    fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// `sasl.mechanism`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SaslMechanism {
    /// User name and password in clear (use with `sasl_ssl`).
    #[serde(rename = "PLAIN")]
    Plain,
    /// SCRAM with SHA-256.
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    /// SCRAM with SHA-512.
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// The librdkafka value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// `compression.codec`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Uncompressed.
    #[default]
    None,
    /// gzip (zlib).
    Gzip,
    /// Snappy.
    Snappy,
    /// LZ4.
    Lz4,
}

impl Compression {
    /// The librdkafka value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
        }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            client_id: "outbox-relay".into(),
            security_protocol: SecurityProtocol::Plaintext,
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            message_timeout: Duration::from_secs(10),
            max_payload_bytes: 1024 * 1024,
            compression: Compression::None,
            allow_auto_create_topics: false,
            properties: BTreeMap::new(),
            topic_prefixes: Vec::new(),
        }
    }
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("client_id", &self.client_id)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password.as_ref().map(|_| "***"))
            .field("message_timeout", &self.message_timeout)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("compression", &self.compression)
            .field("allow_auto_create_topics", &self.allow_auto_create_topics)
            .field("properties", &self.properties)
            .field("topic_prefixes", &self.topic_prefixes)
            .finish()
    }
}

/// Headroom librdkafka's own `message.max.bytes` gets over the payload limit, for the key, the
/// headers and the record framing.
pub(crate) const RECORD_OVERHEAD: usize = 64 * 1024;

/// librdkafka's ceiling for `message.max.bytes`.
const LIBRDKAFKA_MAX_MESSAGE_BYTES: usize = 1_000_000_000;

/// Properties the typed fields own: setting them in `properties` too would be ambiguous.
const OWNED: &[(&str, &str)] = &[
    ("bootstrap.servers", "kafka.brokers"),
    ("metadata.broker.list", "kafka.brokers"),
    ("client.id", "kafka.client_id"),
    ("security.protocol", "kafka.security_protocol"),
    ("sasl.mechanism", "kafka.sasl_mechanism"),
    ("sasl.mechanisms", "kafka.sasl_mechanism"),
    ("sasl.username", "kafka.sasl_username"),
    ("sasl.password", "kafka.sasl_password"),
    ("message.timeout.ms", "kafka.message_timeout"),
    ("delivery.timeout.ms", "kafka.message_timeout"),
    ("message.max.bytes", "kafka.max_payload_bytes"),
    ("compression.codec", "kafka.compression"),
    ("compression.type", "kafka.compression"),
    ("allow.auto.create.topics", "kafka.allow_auto_create_topics"),
];

impl KafkaConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        parse_brokers(&self.brokers)?;
        if self.client_id.is_empty() {
            return Err("kafka.client_id: must not be empty".into());
        }
        if self.security_protocol.uses_sasl() {
            if self.sasl_mechanism.is_none() {
                return Err(format!(
                    "kafka.sasl_mechanism: required with security_protocol = {:?} (PLAIN, \
                     SCRAM-SHA-256 or SCRAM-SHA-512)",
                    self.security_protocol.as_str()
                ));
            }
            if self.sasl_username.as_deref().unwrap_or("").is_empty() {
                return Err(format!(
                    "kafka.sasl_username: required with security_protocol = {:?}",
                    self.security_protocol.as_str()
                ));
            }
            if self.sasl_password.as_deref().unwrap_or("").is_empty() {
                return Err(format!(
                    "kafka.sasl_password: required with security_protocol = {:?}",
                    self.security_protocol.as_str()
                ));
            }
        } else {
            let set = [
                ("kafka.sasl_mechanism", self.sasl_mechanism.is_some()),
                ("kafka.sasl_username", self.sasl_username.is_some()),
                ("kafka.sasl_password", self.sasl_password.is_some()),
            ];
            if let Some((field, _)) = set.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "{field}: only used with security_protocol = \"sasl_plaintext\" or \
                     \"sasl_ssl\" (it is {:?})",
                    self.security_protocol.as_str()
                ));
            }
        }
        if self.message_timeout.is_zero() || self.message_timeout.as_millis() > i32::MAX as u128 {
            return Err("kafka.message_timeout: must be more than 0 and under 24 days".into());
        }
        if self.max_payload_bytes == 0
            || self.max_payload_bytes > LIBRDKAFKA_MAX_MESSAGE_BYTES - RECORD_OVERHEAD
        {
            return Err(format!(
                "kafka.max_payload_bytes: must be between 1 and {}",
                LIBRDKAFKA_MAX_MESSAGE_BYTES - RECORD_OVERHEAD
            ));
        }
        for (key, value) in &self.properties {
            check_property(key, value)?;
        }
        if let Some(bad) = self
            .topic_prefixes
            .iter()
            .find(|p| p.is_empty() || p.starts_with("__"))
        {
            return Err(format!(
                "kafka.topic_prefixes: {bad:?} must be non-empty and not an internal topic's \
                 (__)"
            ));
        }
        Ok(())
    }

    /// librdkafka's `message.max.bytes`: the payload limit plus room for key and headers.
    pub(crate) fn message_max_bytes(&self) -> usize {
        (self.max_payload_bytes + RECORD_OVERHEAD).min(LIBRDKAFKA_MAX_MESSAGE_BYTES)
    }
}

/// Splits `host:port,host:port`, checking every entry.
pub(crate) fn parse_brokers(brokers: &str) -> Result<Vec<&str>, String> {
    let list: Vec<&str> = brokers.split(',').map(str::trim).collect();
    if brokers.trim().is_empty() {
        return Err("kafka.brokers: must list at least one host:port".into());
    }
    for broker in &list {
        let port = broker.rsplit_once(':').and_then(|(host, port)| {
            (!host.is_empty() && !host.contains('/'))
                .then(|| port.parse::<u16>().ok())
                .flatten()
        });
        if !matches!(port, Some(p) if p > 0) {
            return Err(format!(
                "kafka.brokers: {broker:?} is not host:port (expected host:port[,host:port])"
            ));
        }
    }
    Ok(list)
}

/// Refuses a free-form property that has a typed field or would break the guarantees.
fn check_property(key: &str, value: &str) -> Result<(), String> {
    let field = format!("kafka.properties.{key:?}");
    if let Some((_, owner)) = OWNED.iter().find(|(k, _)| *k == key) {
        return Err(format!("{field}: set {owner} instead"));
    }
    let value = value.trim();
    match key {
        "enable.idempotence" if value != "true" => Err(format!(
            "{field}: must stay true: the idempotent producer is what keeps per-key order \
             through retries without duplicates from the producer's own retries"
        )),
        "acks" | "request.required.acks" if !matches!(value, "all" | "-1") => Err(format!(
            "{field}: must be \"all\" (or -1): an event is marked published only once every \
             in-sync replica has it"
        )),
        "max.in.flight" | "max.in.flight.requests.per.connection"
            if !matches!(value.parse::<u32>(), Ok(1..=5)) =>
        {
            Err(format!(
                "{field}: must be between 1 and 5: the idempotent producer keeps per-key order \
                 through retries only up to 5 requests in flight"
            ))
        }
        "retries" | "message.send.max.retries" if value.parse::<u32>().ok() == Some(0) => Err(
            format!("{field}: must be more than 0 (the idempotent producer retries)"),
        ),
        "transactional.id" => Err(format!(
            "{field}: transactions are not used by the relay (each event is acknowledged alone)"
        )),
        _ if key.is_empty() => Err("kafka.properties: empty property name".into()),
        _ => Ok(()),
    }
}

/// Reads a table whose values are strings, integers, floats or booleans, as strings: TOML users
/// write `"linger.ms" = 10`, librdkafka wants `"10"`.
fn scalar_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Bool(bool),
        Int(i64),
        Float(f64),
        Text(String),
    }
    let map = BTreeMap::<String, Scalar>::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Scalar::Bool(b) => b.to_string(),
                Scalar::Int(i) => i.to_string(),
                Scalar::Float(f) => f.to_string(),
                Scalar::Text(s) => s,
            };
            (k, v)
        })
        .collect())
}

/// The bootstrap list of a broker URL `kafka://host:port[,host:port]` (a trailing `/` is
/// allowed); credentials go in the config (`sasl_username` / `sasl_password`), never in it.
pub fn bootstrap_list(url: &str) -> Result<String, String> {
    let list = url
        .strip_prefix("kafka://")
        .unwrap_or(url)
        .trim_end_matches('/');
    if list.is_empty() || list.contains(['/', '@', '?']) {
        return Err(format!(
            "broker URL {url:?}: expected kafka://host:port[,host:port] (credentials go in \
             [kafka] sasl_username / sasl_password)",
            url = crate::redact::url(url)
        ));
    }
    Ok(list.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut KafkaConfig)) -> KafkaConfig {
        let mut c = KafkaConfig::default();
        f(&mut c);
        c
    }

    fn error(c: KafkaConfig) -> String {
        c.validate().expect_err("must be refused")
    }

    #[test]
    fn defaults_are_valid() {
        KafkaConfig::default().validate().unwrap();
        assert_eq!(KafkaConfig::default().max_payload_bytes, 1_048_576);
    }

    #[test]
    fn brokers_must_be_host_port() {
        assert_eq!(parse_brokers("a:1, b:2").unwrap(), ["a:1", "b:2"]);
        for bad in [
            "",
            "host",
            "host:",
            ":9092",
            "a:1,,b:2",
            "kafka://a:1",
            "a:x",
            "a:0",
        ] {
            let e = error(with(|c| c.brokers = bad.into()));
            assert!(e.starts_with("kafka.brokers: "), "{bad:?}: {e}");
        }
    }

    #[test]
    fn sasl_needs_all_three_settings() {
        let e = error(with(|c| c.security_protocol = SecurityProtocol::SaslSsl));
        assert!(e.starts_with("kafka.sasl_mechanism: "), "{e}");
        let e = error(with(|c| {
            c.security_protocol = SecurityProtocol::SaslSsl;
            c.sasl_mechanism = Some(SaslMechanism::ScramSha512);
            c.sasl_username = Some("relay".into());
        }));
        assert!(e.starts_with("kafka.sasl_password: "), "{e}");
        let e = error(with(|c| c.sasl_username = Some("relay".into())));
        assert!(e.starts_with("kafka.sasl_username: only used"), "{e}");
    }

    #[test]
    fn refuses_properties_that_break_the_guarantees() {
        for (key, value, field) in [
            ("enable.idempotence", "false", "enable.idempotence"),
            ("acks", "1", "acks"),
            ("request.required.acks", "0", "request.required.acks"),
            ("max.in.flight", "6", "max.in.flight"),
            ("retries", "0", "retries"),
            ("transactional.id", "x", "transactional.id"),
            ("bootstrap.servers", "x:1", "bootstrap.servers"),
        ] {
            let e = error(with(|c| {
                c.properties.insert(key.into(), value.into());
            }));
            assert!(
                e.starts_with(&format!("kafka.properties.\"{field}\": ")),
                "{key}={value}: {e}"
            );
        }
        for (key, value) in [
            ("acks", "all"),
            ("acks", "-1"),
            ("enable.idempotence", "true"),
            ("max.in.flight", "1"),
            ("linger.ms", "20"),
        ] {
            with(|c| {
                c.properties.insert(key.into(), value.into());
            })
            .validate()
            .unwrap_or_else(|e| panic!("{key}={value}: {e}"));
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let c = with(|c| {
            c.security_protocol = SecurityProtocol::SaslSsl;
            c.sasl_mechanism = Some(SaslMechanism::Plain);
            c.sasl_username = Some("relay".into());
            c.sasl_password = Some("hunter2".into());
        });
        c.validate().unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }

    #[test]
    fn property_values_may_be_numbers_or_booleans() {
        let c: KafkaConfig = serde_json::from_str(
            r#"{"properties": {"linger.ms": 20, "enable.gapless.guarantee": true, "x": "y"}}"#,
        )
        .unwrap();
        assert_eq!(c.properties["linger.ms"], "20");
        assert_eq!(c.properties["enable.gapless.guarantee"], "true");
        assert_eq!(c.properties["x"], "y");
        let e = serde_json::from_str::<KafkaConfig>(r#"{"compression": "zstd"}"#).unwrap_err();
        assert!(e.to_string().contains("zstd"), "{e}");
    }

    #[test]
    fn kafka_urls_give_the_bootstrap_list() {
        assert_eq!(bootstrap_list("kafka://k1:9092").unwrap(), "k1:9092");
        assert_eq!(
            bootstrap_list("kafka://k1:9092,k2:9093/").unwrap(),
            "k1:9092,k2:9093"
        );
        for bad in [
            "kafka://",
            "kafka://user:pw@k1:9092",
            "kafka://k1:9092/topic",
        ] {
            let e = bootstrap_list(bad).unwrap_err();
            assert!(e.contains("expected kafka://host:port"), "{bad}: {e}");
        }
    }
}
