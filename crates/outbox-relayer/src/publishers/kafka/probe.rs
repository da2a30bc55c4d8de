//! `outbox doctor` on Kafka: the cluster answers a metadata request with the relay's own
//! settings (TLS, SASL), and each destination's topic exists. Nothing is produced, and the
//! look-up never creates a topic.

use rdkafka::producer::Producer;

use super::{publisher::create_with, KafkaConfig};
use crate::doctor::{Check, PROBE_TIMEOUT};

const AREA: &str = "broker";

/// Checks `config`'s cluster for `destinations` (topics).
pub async fn probe(config: &KafkaConfig, destinations: &[String]) -> Vec<Check> {
    let mut checks = Vec::new();
    if let Err(error) = config.validate() {
        checks.push(Check::fail(
            AREA,
            "settings",
            error,
            "correct the [kafka] table",
        ));
        return checks;
    }
    let producer = match create_with(config, &[("allow.auto.create.topics", "false")]) {
        Ok(producer) => producer,
        Err(error) => {
            checks.push(Check::fail(
                AREA,
                "settings",
                outbox::error_chain(&error),
                "correct the [kafka] table",
            ));
            return checks;
        }
    };
    let metadata = tokio::task::spawn_blocking(move || {
        producer
            .client()
            .fetch_metadata(None, PROBE_TIMEOUT)
            .map(|m| {
                m.topics()
                    .iter()
                    .filter(|t| t.error().is_none() && !t.partitions().is_empty())
                    .map(|t| t.name().to_owned())
                    .collect::<std::collections::HashSet<_>>()
            })
    })
    .await;
    let topics = match metadata {
        Ok(Ok(topics)) => topics,
        Ok(Err(error)) => {
            checks.push(Check::fail(
                AREA,
                "metadata",
                format!("the cluster did not answer a metadata request: {error}"),
                "check security_protocol, the SASL settings and the advertised listeners",
            ));
            return checks;
        }
        Err(error) => {
            checks.push(Check::fail(AREA, "metadata", error.to_string(), "retry"));
            return checks;
        }
    };
    checks.push(Check::ok(
        AREA,
        "metadata",
        format!("the cluster answers ({} topics)", topics.len()),
    ));
    for topic in destinations {
        let name = format!("topic {topic}");
        checks.push(if topics.contains(topic) {
            Check::ok(AREA, name, "exists")
        } else if config.allow_auto_create_topics {
            Check::warn(
                AREA,
                name,
                "missing; kafka.allow_auto_create_topics = true, so the cluster creates it on \
                 the first publish if its auto.create.topics.enable allows, with its default \
                 partitions and replication",
                format!(
                    "create it with the partitions you want: kafka-topics --create --topic {topic}"
                ),
            )
        } else {
            Check::fail(
                AREA,
                name,
                "missing: its events would fail until it exists",
                format!(
                    "kafka-topics --create --topic {topic} --partitions N --replication-factor 3"
                ),
            )
        });
    }
    checks
}
