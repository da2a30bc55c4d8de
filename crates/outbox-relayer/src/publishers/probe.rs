//! `outbox doctor`'s look at the broker: reachable, credentials accepted, and for the
//! destinations the relay will publish to, the target exists where the broker needs one. Never
//! publishes into a live destination.

use super::{BrokerKind, BrokerSettings};
use crate::doctor::{reach, server_address, Check, PROBE_TIMEOUT};

const AREA: &str = "broker";

impl BrokerKind {
    /// The port a URL of this broker uses when it names none; `None` where the URL does not
    /// name a server (`sqs://REGION`, Azure connection strings).
    pub fn default_port(self, url: &str) -> Option<u16> {
        let tls = url.contains("s://") && !url.starts_with("nats://");
        match self {
            Self::Nats => Some(4222),
            Self::RabbitMq => Some(if tls { 5671 } else { 5672 }),
            Self::Redis => Some(6379),
            Self::Mqtt => Some(if tls { 8883 } else { 1883 }),
            Self::Kafka => Some(9092),
            Self::Webhook => Some(if url.starts_with("https") { 443 } else { 80 }),
            Self::Sqs if url.starts_with("sqs+") => Some(if url.starts_with("sqs+https") {
                443
            } else {
                80
            }),
            Self::Sqs | Self::ServiceBus => None,
        }
    }

    /// `host:port` of the server `url` names, without its credentials.
    pub fn address(self, url: &str) -> Option<String> {
        server_address(url, self.default_port(url)?)
    }
}

/// Checks the broker at `url` for `destinations` (rendered destinations: subjects, routing
/// keys, topics).
pub async fn probe(url: &str, mut settings: BrokerSettings, destinations: &[String]) -> Vec<Check> {
    let kind = match BrokerKind::of_url(url) {
        Ok(kind) => kind,
        Err(error) => {
            return vec![Check::fail(
                AREA,
                "URL",
                error.to_string(),
                "pass --broker-url with one of the schemes above",
            )]
        }
    };
    if !kind.built() {
        return vec![Check::fail(
            AREA,
            "URL",
            kind.not_built().to_string(),
            format!(
                "use an `outbox` built with the `{}` feature (the default build has every broker)",
                kind.feature()
            ),
        )];
    }
    let mut checks = Vec::new();
    if let Some(address) = kind.address(url) {
        match reach(&address, PROBE_TIMEOUT).await {
            Ok(()) => checks.push(Check::ok(
                AREA,
                "reachable",
                format!("{} at {address}", kind.name()),
            )),
            Err(cause) => {
                checks.push(Check::fail(
                    AREA,
                    "reachable",
                    format!("{}: {cause}", kind.name()),
                    "start the broker, or correct the host and port of --broker-url",
                ));
                return checks;
            }
        }
    }
    let url = url.to_owned();
    match kind {
        #[cfg(feature = "nats")]
        BrokerKind::Nats => {
            settings.nats.url = url;
            checks.extend(super::nats::probe(&settings.nats, destinations).await);
        }
        #[cfg(feature = "rabbitmq")]
        BrokerKind::RabbitMq => {
            settings.rabbitmq.url = url;
            checks.extend(super::rabbitmq::probe(&settings.rabbitmq, destinations).await);
        }
        #[cfg(feature = "kafka")]
        BrokerKind::Kafka => {
            match super::kafka::bootstrap_list(&url) {
                Ok(brokers) => settings.kafka.brokers = brokers,
                Err(error) => {
                    checks.push(Check::fail(
                        AREA,
                        "URL",
                        error,
                        "kafka://host:9092[,host:port]",
                    ));
                    return checks;
                }
            }
            checks.extend(super::kafka::probe(&settings.kafka, destinations).await);
        }
        _ => {
            let _ = (&mut settings, url, destinations);
            checks.push(Check::ok(
                AREA,
                "destinations",
                format!(
                    "not checked for {}: the relay reports a missing target as a failure of \
                     the event that needs it",
                    kind.name()
                ),
            ));
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_each_scheme() {
        for (url, expected) in [
            ("nats://127.0.0.1:4333", Some("127.0.0.1:4333")),
            ("nats://localhost", Some("localhost:4222")),
            ("amqp://guest:guest@rabbit/%2f", Some("rabbit:5672")),
            ("amqps://guest:guest@rabbit/%2f", Some("rabbit:5671")),
            ("kafka://k1:9093,k2:9094", Some("k1:9093")),
            ("https://hooks.example/x", Some("hooks.example:443")),
            ("sqs+http://127.0.0.1:5000", Some("127.0.0.1:5000")),
            ("sqs://eu-west-1", None),
        ] {
            let kind = BrokerKind::of_url(url).unwrap();
            assert_eq!(kind.address(url).as_deref(), expected, "{url}");
        }
    }
}
