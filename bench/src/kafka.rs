//! Kafka for `--broker kafka`: the drain's topic (created before the relay starts, as an
//! operator would, since the relay does not auto-create topics), its message count afterwards,
//! and its deletion. Talks to the cluster through rdkafka's admin client.

use std::{sync::Arc, time::Duration};

use rdkafka::{
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    error::RDKafkaErrorCode,
    ClientConfig,
};

use crate::common::Result;

/// How long one admin request or metadata look-up may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// An admin connection to the cluster at `--kafka-brokers`.
pub struct KafkaAdmin {
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
        let metadata = tokio::task::spawn_blocking(move || {
            probe.inner().fetch_metadata(None, TIMEOUT).map(|m| {
                (
                    m.brokers().len(),
                    m.orig_broker_name().to_owned(),
                    m.orig_broker_id(),
                )
            })
        })
        .await?
        .map_err(|e| format!("cannot reach Kafka at {brokers}: {e}"))?;
        let (count, name, id) = metadata;
        Ok(Self {
            admin,
            description: format!("Kafka protocol at {name} (broker id {id}, {count} broker(s))"),
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

    /// Messages held by `topic`: the sum over its partitions of high minus low watermark.
    pub async fn messages(&self, topic: &str) -> Result<u64> {
        let admin = self.admin.clone();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || -> Result<u64> {
            let client = admin.inner();
            let metadata = client.fetch_metadata(Some(&topic), TIMEOUT)?;
            let partitions = metadata
                .topics()
                .first()
                .map(|t| t.partitions().len() as i32)
                .unwrap_or(0);
            let mut total = 0;
            for partition in 0..partitions {
                let (low, high) = client.fetch_watermarks(&topic, partition, TIMEOUT)?;
                total += (high - low).max(0) as u64;
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
