use std::{sync::RwLock, time::Duration};

use futures::future::BoxFuture;
use rdkafka::{
    config::ClientConfig,
    error::{KafkaError, RDKafkaErrorCode},
    message::{Header, OwnedHeaders},
    producer::{FutureProducer, FutureRecord, Producer},
    util::Timeout,
};

use super::{config::parse_brokers, KafkaConfig};
use crate::{
    error::Error, publisher::check_payload_size, publisher::PublishError, publisher::Publisher,
    wire::message::Message,
};

/// Publishes to Kafka with an idempotent producer (`acks=all`) and waits for each message's
/// delivery report.
///
/// One producer serves every lane: librdkafka batches the concurrent lanes' messages per
/// partition. A lane has one message in flight at a time, so a key's order never depends on
/// librdkafka's; the idempotent producer additionally keeps the order of what it does have in
/// flight through its own retries. A producer that hit a fatal error (idempotence state lost)
/// is replaced by a fresh one on the next publish.
pub struct KafkaPublisher {
    config: KafkaConfig,
    client_config: ClientConfig,
    producer: RwLock<FutureProducer>,
}

impl KafkaPublisher {
    /// Validates the configuration and creates the producer. Nothing is sent yet: a cluster
    /// that is down at start-up is not fatal, publishes fail as transient until it is up.
    pub async fn connect(config: KafkaConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::Config)?;
        let client_config = client_config(&config);
        let producer = create(&client_config)?;
        tracing::info!(brokers = %config.brokers, client_id = %config.client_id,
            security_protocol = config.security_protocol.as_str(),
            "kafka producer created (idempotent, acks=all)");
        Ok(Self {
            config,
            client_config,
            producer: RwLock::new(producer),
        })
    }

    /// The current producer, or a new one when the current one hit a fatal error.
    fn producer(&self) -> Result<FutureProducer, PublishError> {
        let current = self.producer.read().expect("producer lock").clone();
        let Some((code, reason)) = current.client().fatal_error() else {
            return Ok(current);
        };
        let mut slot = self.producer.write().expect("producer lock");
        if slot.client().fatal_error().is_some() {
            tracing::warn!(?code, %reason, "kafka producer hit a fatal error; replacing it");
            *slot = create(&self.client_config)
                .map_err(|e| PublishError::transient(format!("kafka: {e}")))?;
        }
        Ok(slot.clone())
    }
}

/// The librdkafka settings: the guarantees first, then the user's extra properties (validated
/// not to weaken them).
fn client_config(config: &KafkaConfig) -> ClientConfig {
    let brokers = parse_brokers(&config.brokers)
        .map(|list| list.join(","))
        .unwrap_or_default();
    let timeout_ms = config.message_timeout.as_millis();
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("client.id", &config.client_id)
        // The broker dedupes the producer's own retries and keeps their order.
        .set("enable.idempotence", "true")
        // Ok means every in-sync replica has the message (G3).
        .set("acks", "all")
        // The most the idempotent producer allows while keeping order through retries.
        .set("max.in.flight.requests.per.connection", "5")
        // Bounds how long a publish can take, retries included: an unreachable cluster is a
        // transient error after this, not a hang.
        .set("message.timeout.ms", timeout_ms.to_string())
        // A missing topic is reported well within the message timeout (librdkafka waits 30s
        // by default for a new topic to propagate before calling it unknown).
        .set(
            "topic.metadata.propagation.max.ms",
            (timeout_ms / 2).to_string(),
        )
        .set("message.max.bytes", config.message_max_bytes().to_string())
        .set("compression.codec", config.compression.as_str())
        .set(
            "allow.auto.create.topics",
            config.allow_auto_create_topics.to_string(),
        )
        // Java's partitioner for keyed records: the same aggregate lands on the same
        // partition whether a Java or a librdkafka client produced it.
        .set("partitioner", "murmur2_random")
        .set("security.protocol", config.security_protocol.as_str());
    if let Some(mechanism) = config.sasl_mechanism {
        c.set("sasl.mechanism", mechanism.as_str());
    }
    if let Some(user) = &config.sasl_username {
        c.set("sasl.username", user);
    }
    if let Some(password) = &config.sasl_password {
        c.set("sasl.password", password);
    }
    for (key, value) in &config.properties {
        c.set(key, value);
    }
    c
}

/// A producer with the relay's settings for `config`, `overrides` set last.
pub(super) fn create_with(
    config: &KafkaConfig,
    overrides: &[(&str, &str)],
) -> Result<FutureProducer, Error> {
    let mut c = client_config(config);
    for (key, value) in overrides {
        c.set(*key, *value);
    }
    create(&c)
}

fn create(config: &ClientConfig) -> Result<FutureProducer, Error> {
    config.create().map_err(|e| match e {
        // librdkafka names the property; values may be secrets, so they are not repeated.
        KafkaError::ClientConfig(_, description, key, _) => {
            Error::Config(format!("kafka.properties.{key:?}: {description}"))
        }
        other => Error::broker("kafka: cannot create the producer", other),
    })
}

/// What a fresh metadata look-up said about a message's topic, after librdkafka called it
/// unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TopicLookup {
    /// The cluster has it: it was created after librdkafka cached it as missing.
    Exists,
    /// The cluster does not have it.
    Missing,
    /// The look-up itself failed (cluster unreachable).
    Failed,
}

/// Whether `error` says the message's topic does not exist.
fn is_unknown_topic(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::UnknownTopic | RDKafkaErrorCode::UnknownTopicOrPartition)
    )
}

/// Asks the cluster whether `topic` exists. The answer also refreshes librdkafka's cache, so a
/// topic created after the producer first saw it missing is found by the next attempt (instead
/// of after `topic.metadata.refresh.interval.ms`, 5 minutes).
async fn lookup_topic(producer: FutureProducer, topic: String, timeout: Duration) -> TopicLookup {
    let answer = tokio::task::spawn_blocking(move || {
        let metadata = producer.client().fetch_metadata(Some(&topic), timeout)?;
        Ok::<_, KafkaError>(
            metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()),
        )
    })
    .await;
    match answer {
        Ok(Ok(true)) => TopicLookup::Exists,
        Ok(Ok(false)) => TopicLookup::Missing,
        _ => TopicLookup::Failed,
    }
}

/// Classifies a librdkafka error: the one place Kafka errors become retry decisions. `topic`
/// is what a fresh look-up said of the message's topic when the error called it unknown.
fn classify(error: &KafkaError, topic: Option<TopicLookup>) -> PublishError {
    use RDKafkaErrorCode as E;
    let text = format!("kafka: {error}");
    let Some(code) = error.rdkafka_error_code() else {
        return match error {
            // A string with a NUL byte cannot be handed to librdkafka, however often it is
            // retried.
            KafkaError::Nul(_) => PublishError::permanent(text),
            _ => PublishError::transient(text),
        };
    };
    match code {
        // The message itself cannot be accepted.
        E::MessageSizeTooLarge
        | E::InvalidMessageSize
        | E::MessageBatchTooLarge
        | E::BadMessage
        | E::InvalidRecord
        | E::InvalidTimestamp
        | E::UnsupportedForMessageFormat
        | E::PolicyViolation
        | E::InvalidArgument => PublishError::permanent(text),
        // The topic does not exist (auto-creation is off)… unless the cluster says it does now,
        // or cannot be asked.
        E::UnknownTopic | E::UnknownTopicOrPartition => match topic {
            Some(TopicLookup::Exists) => PublishError::transient(format!(
                "{text} (the topic exists now: it was created after the producer saw it \
                 missing; the next attempt sees it)"
            )),
            Some(TopicLookup::Failed) => {
                PublishError::transient(format!("{text} (the cluster could not confirm it)"))
            }
            Some(TopicLookup::Missing) | None => PublishError::permanent(format!(
                "{text} (the topic does not exist and the relay does not create topics: create \
                 it, or set kafka.allow_auto_create_topics)"
            )),
        },
        // Its destination is not a topic or may not be written to.
        E::InvalidTopic
        | E::UnknownPartition
        | E::TopicAuthorizationFailed
        | E::ClusterAuthorizationFailed => PublishError::permanent(text),
        // Everything else is the cluster's state, not the message's: timeouts (the message may
        // have been delivered), transport, all brokers down, queue full, leader changes, too
        // few replicas, throttling, authentication, a fatal producer error (the producer is
        // replaced)… Retrying is right, and an unknown code is never a reason to dead-letter.
        _ => PublishError::transient(text),
    }
}

/// Whether `topic` is a legal Kafka topic name: 1 to 249 characters of `[a-zA-Z0-9._-]`, and
/// neither `.` nor `..`.
pub fn is_valid_topic(topic: &str) -> bool {
    (1..=249).contains(&topic.len())
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Publisher for KafkaPublisher {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            check_payload_size(message, self.config.max_payload_bytes)?;
            self.check_destination(&message.destination)?;
            let producer = self.producer()?;
            let mut headers = OwnedHeaders::new_with_capacity(message.headers.len() + 8);
            message.visit_headers(|key, value| {
                headers = std::mem::take(&mut headers).insert(Header {
                    key,
                    value: Some(value),
                });
            });
            let record = FutureRecord::to(&message.destination)
                .key(message.aggregate_id.as_bytes())
                .payload(&message.payload[..])
                .headers(headers);
            // Waits for room in librdkafka's queue at most as long as for a delivery, then
            // for the delivery report itself (bounded by message.timeout.ms).
            match producer
                .send(record, Timeout::After(self.config.message_timeout))
                .await
            {
                Ok(_) => Ok(()),
                Err((error, _)) if is_unknown_topic(&error) => {
                    let timeout = self.config.message_timeout.min(Duration::from_secs(5));
                    let topic = lookup_topic(producer, message.destination.clone(), timeout).await;
                    Err(classify(&error, Some(topic)))
                }
                Err((error, _)) => Err(classify(&error, None)),
            }
        })
    }

    fn name(&self) -> &'static str {
        "kafka"
    }

    fn max_payload_bytes(&self) -> usize {
        self.config.max_payload_bytes
    }

    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        check_topic(destination, &self.config.topic_prefixes)
    }
}

/// Refuses, as permanent, a topic an event may not be published to: an illegal name, an
/// internal topic (`__consumer_offsets`, `__transaction_state`: any `__` prefix, which Kafka
/// reserves for itself), or one outside `kafka.topic_prefixes` when that is set. The error
/// names the topic and the rule.
fn check_topic(topic: &str, prefixes: &[String]) -> Result<(), PublishError> {
    if !is_valid_topic(topic) {
        return Err(PublishError::permanent(format!(
            "kafka: {topic:?} is not a valid Kafka topic name (1 to 249 characters of \
             letters, digits, '.', '_' or '-'; not \".\" or \"..\")"
        )));
    }
    if topic.starts_with("__") {
        return Err(PublishError::permanent(format!(
            "kafka: topic {topic:?} refused: topics starting with \"__\" are Kafka's internal \
             topics (consumer offsets, transaction state)"
        )));
    }
    if topic == "_schemas" || topic.starts_with("_confluent") {
        return Err(PublishError::permanent(format!(
            "kafka: topic {topic:?} refused: it is the Schema Registry's or the Confluent \
             platform's own topic"
        )));
    }
    crate::wire::routing::check_prefixes("kafka.topic_prefixes", topic, prefixes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publisher::FailureClass::{Permanent, Transient};

    fn class(error: KafkaError) -> crate::publisher::FailureClass {
        classify(&error, None).class
    }

    #[test]
    fn internal_and_illegal_topics_are_refused_naming_topic_and_rule() {
        check_topic("orders.placed", &[]).unwrap();
        check_topic("_schemas_like", &[]).unwrap();
        for (topic, rule) in [
            ("__consumer_offsets", "internal"),
            ("__transaction_state", "internal"),
            ("__anything", "internal"),
            ("_schemas", "Schema Registry"),
            ("_confluent-metrics", "Schema Registry"),
            (".", "not a valid"),
            ("..", "not a valid"),
            ("", "not a valid"),
            ("a/b", "not a valid"),
            ("a b", "not a valid"),
            (&"t".repeat(250), "not a valid"),
        ] {
            let error = check_topic(topic, &[]).unwrap_err();
            assert_eq!(error.class, Permanent, "{topic}");
            assert!(error.message.contains(rule), "{error}");
            assert!(error.message.contains(&format!("{topic:?}")), "{error}");
        }
        check_topic(&"t".repeat(249), &[]).unwrap();
        let prefixes = vec!["orders.".to_owned()];
        check_topic("orders.placed", &prefixes).unwrap();
        let error = check_topic("billing", &prefixes).unwrap_err();
        assert!(error.message.contains("kafka.topic_prefixes"), "{error}");
    }

    #[test]
    fn message_and_destination_problems_are_permanent() {
        use RDKafkaErrorCode as E;
        for code in [
            E::MessageSizeTooLarge,
            E::InvalidMessageSize,
            E::InvalidTopic,
            E::UnknownTopic,
            E::UnknownTopicOrPartition,
            E::TopicAuthorizationFailed,
            E::ClusterAuthorizationFailed,
            E::InvalidRecord,
        ] {
            assert_eq!(
                class(KafkaError::MessageProduction(code)),
                Permanent,
                "{code:?}"
            );
        }
    }

    #[test]
    fn cluster_problems_are_transient() {
        use RDKafkaErrorCode as E;
        for code in [
            E::MessageTimedOut,
            E::RequestTimedOut,
            E::OperationTimedOut,
            E::BrokerTransportFailure,
            E::AllBrokersDown,
            E::QueueFull,
            E::NotLeaderForPartition,
            E::LeaderNotAvailable,
            E::NotEnoughReplicas,
            E::NotEnoughReplicasAfterAppend,
            E::NetworkException,
            E::ThrottlingQuotaExceeded,
            E::Authentication,
            E::Fatal,
            E::OutOfOrderSequenceNumber,
            E::Unknown,
        ] {
            assert_eq!(
                class(KafkaError::MessageProduction(code)),
                Transient,
                "{code:?}"
            );
        }
        assert_eq!(class(KafkaError::Canceled), Transient);
    }

    #[test]
    fn errors_name_the_cause() {
        let e = classify(
            &KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut),
            None,
        );
        assert!(e.message.starts_with("kafka: "), "{e}");
        assert!(e.message.contains("timed out"), "{e}");
    }

    #[test]
    fn an_unknown_topic_is_permanent_only_if_the_cluster_confirms_it() {
        let unknown = KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopic);
        let e = classify(&unknown, Some(TopicLookup::Missing));
        assert_eq!(e.class, Permanent);
        assert!(e.message.contains("does not exist"), "{e}");
        assert_eq!(
            classify(&unknown, Some(TopicLookup::Exists)).class,
            Transient
        );
        assert_eq!(
            classify(&unknown, Some(TopicLookup::Failed)).class,
            Transient
        );
    }

    #[test]
    fn validates_topic_names() {
        for good in ["orders", "order.OrderPlaced", "a-b_c.9", &"x".repeat(249)] {
            assert!(is_valid_topic(good), "{good:?}");
        }
        for bad in ["", ".", "..", "a b", "a/b", "é", "a*", &"x".repeat(250)] {
            assert!(!is_valid_topic(bad), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn unknown_properties_are_configuration_errors() {
        let mut config = KafkaConfig::default();
        config
            .properties
            .insert("no.such.property".into(), "1".into());
        let Err(Error::Config(e)) = KafkaPublisher::connect(config).await else {
            panic!("an unknown librdkafka property must be refused");
        };
        assert!(
            e.starts_with("kafka.properties.\"no.such.property\": "),
            "{e}"
        );
    }

    #[tokio::test]
    async fn refuses_bad_topics_and_oversized_payloads_without_sending() {
        let publisher = KafkaPublisher::connect(KafkaConfig {
            max_payload_bytes: 10,
            ..Default::default()
        })
        .await
        .unwrap();
        let mut m = crate::wire::message::sample(1, "a1");
        m.payload = bytes::Bytes::from_static(b"12345678901");
        let e = publisher.publish(&m).await.unwrap_err();
        assert_eq!(e.class, Permanent);
        assert!(e.message.contains("10 bytes"), "{e}");
        m.payload = bytes::Bytes::from_static(b"{}");
        m.destination = "a/b".into();
        let e = publisher.publish(&m).await.unwrap_err();
        assert_eq!(e.class, Permanent);
        assert!(e.message.contains("not a valid Kafka topic"), "{e}");
    }
}
