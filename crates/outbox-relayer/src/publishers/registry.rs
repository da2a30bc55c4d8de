//! From a broker URL to a publisher: the one place that knows every URL scheme. A scheme whose
//! publisher this build leaves out (its cargo feature off) is refused with a sentence that
//! names the feature, not taken for an unknown scheme.

use std::sync::Arc;

use crate::{error::Error, publisher::Publisher};

/// The brokers the relay can publish to, whether or not this build includes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerKind {
    /// NATS JetStream: `nats://`, `tls://`.
    Nats,
    /// RabbitMQ (AMQP 0-9-1): `amqp://`, `amqps://`.
    RabbitMq,
    /// Redis Streams: `redis://`, `rediss://`.
    Redis,
    /// MQTT 5: `mqtt://`, `mqtts://`.
    Mqtt,
    /// AWS SQS: `sqs://REGION`, `sqs+http(s)://host:port`.
    Sqs,
    /// Azure Service Bus and AMQP 1.0: `sb://`, `amqp1://`, `amqps1://`, `Endpoint=…` strings.
    ServiceBus,
    /// Kafka: `kafka://host:port[,host:port]`.
    Kafka,
    /// HTTP webhook: `http(s)://`.
    Webhook,
}

impl BrokerKind {
    /// Every kind, in the order URLs are described to users.
    pub const ALL: [BrokerKind; 8] = [
        BrokerKind::Nats,
        BrokerKind::RabbitMq,
        BrokerKind::Kafka,
        BrokerKind::Sqs,
        BrokerKind::ServiceBus,
        BrokerKind::Redis,
        BrokerKind::Mqtt,
        BrokerKind::Webhook,
    ];

    /// The broker a URL names; the error lists the schemes there are.
    pub fn of_url(url: &str) -> Result<Self, Error> {
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        let kind = match scheme.as_deref() {
            Some("nats" | "tls") => Self::Nats,
            Some("amqp" | "amqps") => Self::RabbitMq,
            Some("redis" | "rediss") => Self::Redis,
            Some("mqtt" | "mqtts") => Self::Mqtt,
            Some("sqs" | "sqs+http" | "sqs+https") => Self::Sqs,
            Some("sb" | "amqp1" | "amqps1") => Self::ServiceBus,
            _ if url.to_ascii_lowercase().contains("endpoint=") => Self::ServiceBus,
            Some("kafka") => Self::Kafka,
            Some("http" | "https") => Self::Webhook,
            other => {
                return Err(Error::Config(format!(
                    "broker URL scheme {:?} is not supported: use nats://, amqp(s)://, \
                     kafka://, sqs://, sqs+http(s)://, sb://, amqp1://, amqps1://, an Azure \
                     Service Bus connection string, redis(s)://, mqtt(s):// or http(s)://",
                    other.unwrap_or("")
                )))
            }
        };
        Ok(kind)
    }

    /// The cargo feature of `outbox-relayer` (and of the `outbox` binary) that builds it in.
    pub fn feature(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::RabbitMq => "rabbitmq",
            Self::Redis => "redis",
            Self::Mqtt => "mqtt",
            Self::Sqs => "sqs",
            Self::ServiceBus => "servicebus",
            Self::Kafka => "kafka",
            Self::Webhook => "webhook",
        }
    }

    /// Its name in sentences.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nats => "NATS JetStream",
            Self::RabbitMq => "RabbitMQ",
            Self::Redis => "Redis Streams",
            Self::Mqtt => "MQTT",
            Self::Sqs => "AWS SQS",
            Self::ServiceBus => "Azure Service Bus / AMQP 1.0",
            Self::Kafka => "Kafka",
            Self::Webhook => "HTTP webhook",
        }
    }

    /// Whether this build includes its publisher.
    pub fn built(self) -> bool {
        match self {
            Self::Nats => cfg!(feature = "nats"),
            Self::RabbitMq => cfg!(feature = "rabbitmq"),
            Self::Redis => cfg!(feature = "redis"),
            Self::Mqtt => cfg!(feature = "mqtt"),
            Self::Sqs => cfg!(feature = "sqs"),
            Self::ServiceBus => cfg!(feature = "servicebus"),
            Self::Kafka => cfg!(feature = "kafka"),
            Self::Webhook => cfg!(feature = "webhook"),
        }
    }

    /// The error for a broker this build leaves out.
    pub(crate) fn not_built(self) -> Error {
        let built: Vec<&str> = Self::ALL
            .iter()
            .filter(|k| k.built())
            .map(|k| k.feature())
            .collect();
        Error::Config(format!(
            "this build of the relay has no {} publisher: build it with the cargo feature `{}` \
             (built in: {})",
            self.name(),
            self.feature(),
            if built.is_empty() {
                "none".to_owned()
            } else {
                built.join(", ")
            }
        ))
    }
}

/// The settings of every publisher (the `[nats]`, `[rabbitmq]`, … tables of the config file),
/// whether or not this build includes it. [`connect`] sets the URL of the one it builds from
/// the broker URL.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct BrokerSettings {
    /// NATS JetStream.
    pub nats: super::nats::NatsConfig,
    /// RabbitMQ.
    pub rabbitmq: super::rabbitmq::RabbitMqConfig,
    /// Redis Streams.
    pub redis: super::redis::RedisConfig,
    /// MQTT.
    pub mqtt: super::mqtt::MqttConfig,
    /// AWS SQS.
    pub sqs: super::sqs::SqsConfig,
    /// Azure Service Bus / AMQP 1.0.
    pub servicebus: super::servicebus::ServiceBusConfig,
    /// Kafka.
    pub kafka: super::kafka::KafkaConfig,
    /// HTTP webhook.
    pub webhook: super::webhook::WebhookConfig,
}

/// Connects the publisher `url` names, with its settings from `settings` and its URL from
/// `url`. Errors name what is wrong: an unknown scheme, a broker this build leaves out, a URL
/// of the wrong shape, a broker that cannot be reached.
#[allow(unused_mut, unused_variables)] // a build without any publisher uses neither
pub async fn connect(url: &str, mut settings: BrokerSettings) -> Result<Arc<dyn Publisher>, Error> {
    let kind = BrokerKind::of_url(url)?;
    if !kind.built() {
        return Err(kind.not_built());
    }
    let url = url.to_owned();
    match kind {
        #[cfg(feature = "nats")]
        BrokerKind::Nats => {
            settings.nats.url = url;
            Ok(Arc::new(
                super::nats::NatsPublisher::connect(settings.nats).await?,
            ))
        }
        #[cfg(feature = "rabbitmq")]
        BrokerKind::RabbitMq => {
            settings.rabbitmq.url = url;
            Ok(Arc::new(
                super::rabbitmq::RabbitMqPublisher::connect(settings.rabbitmq).await?,
            ))
        }
        #[cfg(feature = "redis")]
        BrokerKind::Redis => {
            settings.redis.url = url;
            Ok(Arc::new(super::redis::RedisPublisher::connect(
                settings.redis,
            )?))
        }
        #[cfg(feature = "mqtt")]
        BrokerKind::Mqtt => {
            settings.mqtt.url = url;
            Ok(Arc::new(super::mqtt::MqttPublisher::connect(
                settings.mqtt,
            )?))
        }
        #[cfg(feature = "sqs")]
        BrokerKind::Sqs => {
            settings.sqs.apply_broker_url(&url).map_err(Error::Config)?;
            Ok(Arc::new(
                super::sqs::SqsPublisher::connect(settings.sqs).await?,
            ))
        }
        #[cfg(feature = "servicebus")]
        BrokerKind::ServiceBus => {
            settings.servicebus.set_broker_url(url);
            Ok(Arc::new(
                super::servicebus::ServiceBusPublisher::connect(settings.servicebus).await?,
            ))
        }
        #[cfg(feature = "kafka")]
        BrokerKind::Kafka => {
            settings.kafka.brokers = super::kafka::bootstrap_list(&url).map_err(Error::Config)?;
            Ok(Arc::new(
                super::kafka::KafkaPublisher::connect(settings.kafka).await?,
            ))
        }
        #[cfg(feature = "webhook")]
        BrokerKind::Webhook => {
            settings.webhook.url = url;
            Ok(Arc::new(super::webhook::WebhookPublisher::new(
                settings.webhook,
            )?))
        }
        #[allow(unreachable_patterns)] // every kind is built in the default build
        other => Err(other.not_built()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_names_its_broker() {
        for (url, kind) in [
            ("nats://h:4222", BrokerKind::Nats),
            ("tls://h:4222", BrokerKind::Nats),
            ("amqp://u:p@h/%2f", BrokerKind::RabbitMq),
            ("AMQPS://h", BrokerKind::RabbitMq),
            ("redis://h", BrokerKind::Redis),
            ("mqtts://h", BrokerKind::Mqtt),
            ("sqs://eu-west-1", BrokerKind::Sqs),
            ("sqs+http://localhost:5000", BrokerKind::Sqs),
            ("sb://ns.servicebus.windows.net", BrokerKind::ServiceBus),
            ("amqps1://h", BrokerKind::ServiceBus),
            (
                "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s",
                BrokerKind::ServiceBus,
            ),
            ("kafka://k1:9092,k2:9092", BrokerKind::Kafka),
            (
                "https://example.com/hook/{destination}",
                BrokerKind::Webhook,
            ),
        ] {
            assert_eq!(BrokerKind::of_url(url).unwrap(), kind, "{url}");
        }
        let error = BrokerKind::of_url("ftp://h").unwrap_err().to_string();
        assert!(error.contains("scheme \"ftp\" is not supported"), "{error}");
    }

    #[test]
    fn a_broker_left_out_of_the_build_is_named_with_its_feature() {
        let error = BrokerKind::Kafka.not_built().to_string();
        assert!(
            error.contains("no Kafka publisher: build it with the cargo feature `kafka`"),
            "{error}"
        );
    }
}
