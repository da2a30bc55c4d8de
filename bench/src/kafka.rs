//! Kafka for `--broker kafka`: the drain's topic (created before the relay starts, as an
//! operator would, since the relay does not auto-create topics), its message count afterwards,
//! and its deletion. Talks to the cluster through rdkafka's admin client and a consumer.

use std::{sync::Arc, time::Duration};

use rdkafka::{
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{BaseConsumer, Consumer},
    error::RDKafkaErrorCode,
    ClientConfig, Offset, TopicPartitionList,
};

use crate::common::Result;

/// How long one admin request or metadata look-up may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Counting stops after this long without a message.
const IDLE: Duration = Duration::from_secs(5);

/// An admin connection to the cluster at `--kafka-brokers`.
pub struct KafkaAdmin {
    brokers: String,
    admin: Arc<AdminClient<DefaultClientContext>>,
    /// What the cluster told about itself, for the report.
    pub description: String,
}

impl KafkaAdmin {
    /// Connects and reads the cluster's metadata (so an unreachable cluster fails here).
    pub async fn connect(brokers: &str) -> Result<Self> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("client.id", "outbox-bench")
            .create()
            .map_err(|e| format!("kafka admin client for {brokers}: {e}"))?;
        let admin = Arc::new(admin);
        let probe = admin.clone();
        let listed = tokio::task::spawn_blocking(move || {
            probe.inner().fetch_metadata(None, TIMEOUT).map(|m| {
                m.brokers()
                    .iter()
                    .map(|b| format!("{}:{} (id {})", b.host(), b.port(), b.id()))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
        })
        .await?
        .map_err(|e| format!("cannot reach Kafka at {brokers}: {e}"))?;
        Ok(Self {
            brokers: brokers.to_owned(),
            admin,
            description: format!("Kafka protocol, brokers {listed}"),
        })
    }

    /// Creates `topic` with `partitions` partitions, deleting a leftover one first.
    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        let _ = self.delete_topic(topic).await;
        let options = AdminOptions::new().request_timeout(Some(TIMEOUT));
        let spec = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let results = self.admin.create_topics([&spec], &options).await?;
        for result in results {
            match result {
                Ok(_) => {}
                Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    return Err(format!("topic {name} still exists after deleting it").into())
                }
                Err((name, code)) => {
                    return Err(format!("cannot create topic {name}: {code}").into())
                }
            }
        }
        Ok(())
    }

    /// Messages held by `topic`, counted by reading every partition from the beginning until
    /// `expected` were read or none came for 5 s. (Watermarks would be cheaper, but tansu 0.6.0
    /// reports high watermarks below the partition's real end: 19,808 for 20,000 records that a
    /// consumer reads in full.)
    pub async fn messages(&self, topic: &str, expected: u64) -> Result<u64> {
        let brokers = self.brokers.clone();
        let admin = self.admin.clone();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || -> Result<u64> {
            let metadata = admin.inner().fetch_metadata(Some(&topic), TIMEOUT)?;
            let partitions = metadata
                .topics()
                .first()
                .map(|t| t.partitions().len() as i32)
                .unwrap_or(0);
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", format!("outbox-bench-count-{topic}"))
                .set("enable.auto.commit", "false")
                .create()?;
            let mut assignment = TopicPartitionList::new();
            for partition in 0..partitions {
                assignment.add_partition_offset(&topic, partition, Offset::Beginning)?;
            }
            consumer.assign(&assignment)?;
            let mut total = 0;
            let mut last = std::time::Instant::now();
            while total < expected && last.elapsed() < IDLE {
                if let Some(message) = consumer.poll(Duration::from_millis(200)) {
                    message?;
                    total += 1;
                    last = std::time::Instant::now();
                }
            }
            Ok(total)
        })
        .await?
    }

    /// Deletes `topic`.
    pub async fn delete_topic(&self, topic: &str) -> Result<()> {
        let options = AdminOptions::new().request_timeout(Some(TIMEOUT));
        for result in self.admin.delete_topics(&[topic], &options).await? {
            if let Err((name, code)) = result {
                return Err(format!("cannot delete topic {name}: {code}").into());
            }
        }
        Ok(())
    }
}
