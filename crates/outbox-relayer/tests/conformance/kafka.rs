//! Kafka (rdkafka): idempotent producer, `acks=all`, delivery report as the ack, key =
//! aggregate id, record headers. Kafka has no broker-side dedupe by event id. The broker here
//! is tansu (a Kafka-protocol broker): the shared one on 127.0.0.1:9092
//! (`scripts/tools/kafka.sh`), a private one for the outage test. Topics are created and
//! deleted through the Kafka admin API; messages are read back with an rdkafka consumer
//! assigned to every partition from the beginning (no consumer group).

use std::{collections::BTreeMap, process::Command, sync::Arc, time::Duration};

use outbox_relayer::{
    publishers::kafka::{KafkaConfig, KafkaPublisher},
    Publisher,
};
use outbox_testkit::{unique, BrokerProcess, Delivery};
use rdkafka::{
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{BaseConsumer, Consumer},
    error::RDKafkaErrorCode,
    message::{Headers, Message as _},
    ClientConfig, Offset, TopicPartitionList,
};

use crate::suite::{message, publish_until_acked, Harness, WAIT};

/// The shared broker (`scripts/tools/kafka.sh`); `OUTBOX_TEST_KAFKA_BROKERS` overrides it.
fn shared_brokers() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// The tansu binary: `TANSU`, else the tools folder, else `tansu` on the PATH.
fn tansu() -> String {
    if let Ok(path) = std::env::var("TANSU") {
        return path;
    }
    let installed = "/opt/outbox-tools/tansu/bin/tansu";
    if std::path::Path::new(installed).exists() {
        installed.into()
    } else {
        "tansu".into()
    }
}

/// Destinations the suite spreads messages over.
const DESTINATIONS: usize = 4;
/// Partitions per topic: several, so that the key (aggregate id) decides the partition.
const PARTITIONS: i32 = 3;

pub struct Kafka {
    brokers: String,
    prefix: String,
    created: bool,
}

impl Kafka {
    fn topics(&self) -> Vec<String> {
        (0..DESTINATIONS).map(|i| self.destination(i)).collect()
    }

    fn admin(&self) -> Result<AdminClient<DefaultClientContext>, String> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()
            .map_err(|e| format!("kafka admin client: {e}"))
    }
}

impl Harness for Kafka {
    const DEDUPES: bool = false;

    fn shared_url() -> String {
        shared_brokers()
    }

    fn private_url(port: u16) -> String {
        format!("127.0.0.1:{port}")
    }

    fn private_server(broker: &BrokerProcess) -> Command {
        let url = format!("tcp://127.0.0.1:{}", broker.port);
        let mut command = Command::new(tansu());
        command
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
            ])
            .arg(&url)
            .args(["--storage-engine", "memory://tansu/"])
            .current_dir(&broker.dir);
        command
    }

    fn new(brokers: String) -> Self {
        Self {
            brokers,
            prefix: unique("conf"),
            created: false,
        }
    }

    async fn prepare(&mut self) -> Result<(), String> {
        if self.created {
            return Ok(());
        }
        let admin = self.admin()?;
        let names = self.topics();
        let topics: Vec<NewTopic> = names
            .iter()
            .map(|name| NewTopic::new(name, PARTITIONS, TopicReplication::Fixed(1)))
            .collect();
        let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
        let results = admin
            .create_topics(&topics, &options)
            .await
            .map_err(|e| format!("create topics: {e}"))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => return Err(format!("create topic {topic}: {code}")),
            }
        }
        self.created = true;
        Ok(())
    }

    fn destination(&self, i: usize) -> String {
        format!("{}.d{i}.OrderPlaced", self.prefix)
    }

    fn unroutable(&self) -> Option<String> {
        // Never created, and the publisher may not have it auto-created.
        Some(format!("{}.nowhere", unique("conf")))
    }

    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(
            KafkaPublisher::connect(KafkaConfig {
                brokers: self.brokers.clone(),
                message_timeout: Duration::from_secs(5),
                ..Default::default()
            })
            .await
            .expect("kafka publisher"),
        )
    }

    async fn read(&self, n: usize) -> Vec<Delivery> {
        let brokers = self.brokers.clone();
        let topics = self.topics();
        tokio::task::spawn_blocking(move || read_from_start(&brokers, &topics, n))
            .await
            .expect("reader")
    }

    async fn cleanup(self) {
        if !self.created {
            return;
        }
        let Ok(admin) = self.admin() else { return };
        let names = self.topics();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
        match admin.delete_topics(&names, &options).await {
            Ok(results) => {
                for failed in results.into_iter().filter_map(Result::err) {
                    println!("could not delete topic {}: {}", failed.0, failed.1);
                }
            }
            Err(e) => println!("could not delete topics: {e}"),
        }
    }
}

/// Reads every partition of `topics` from the beginning, without a consumer group, until `n`
/// messages arrived (or the suite's wait ran out: then the test's own assertion fails).
/// Messages of one partition are in the broker's order; partitions interleave.
fn read_from_start(brokers: &str, topics: &[String], n: usize) -> Vec<Delivery> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("conf-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .expect("kafka consumer");
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        for partition in 0..PARTITIONS {
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .expect("partition offset");
        }
    }
    consumer.assign(&assignment).expect("assign partitions");
    let deadline = std::time::Instant::now() + WAIT;
    let mut read = Vec::new();
    while read.len() < n && std::time::Instant::now() < deadline {
        let Some(next) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = next.expect("kafka consume");
        let headers: BTreeMap<String, String> = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut delivery = Delivery::from_headers(
            message.topic().to_owned(),
            headers,
            message.payload().unwrap_or_default().to_vec(),
        );
        let key = message
            .key()
            .map(|k| String::from_utf8_lossy(k).into_owned());
        assert_eq!(
            key.as_deref(),
            Some(delivery.aggregate_id.as_str()),
            "the record key is the aggregate id"
        );
        delivery.destination = message.topic().to_owned();
        read.push(delivery);
    }
    read
}

crate::conformance_tests!(Kafka);

/// A topic created after the producer saw it missing: the publish before fails as permanent,
/// the ones after go through at once (librdkafka would otherwise keep the topic cached as
/// missing until its next periodic metadata refresh, 5 minutes later).
#[tokio::test]
async fn a_topic_created_after_a_failed_publish_is_found() {
    let mut harness = Kafka::new(Kafka::shared_url());
    let publisher = harness.publisher().await;
    let m = message(harness.destination(0), "agg-late", 1, b"{}");
    let e = publisher
        .publish(&m)
        .await
        .expect_err("the topic does not exist yet");
    assert!(!e.is_transient(), "a missing topic is permanent: {e}");
    harness.prepare().await.expect("create the topics");
    // Panics on a permanent failure: after the creation only transient ones are acceptable.
    publish_until_acked(&*publisher, &m).await;
    assert_eq!(harness.read(1).await.len(), 1);
    harness.cleanup().await;
}
