//! Once and in order at the handler, through the Kafka runner (a real Kafka-protocol broker,
//! tansu, and PostgreSQL): one aggregate's events over several topics, which Kafka does not
//! order between.
#![cfg(feature = "kafka")]

mod common;

use std::{sync::Arc, time::Duration};

use common::{held_rows, Ledger, Sequencer};
use outbox_consumer::{
    kafka::{KafkaConsumer, KafkaSource},
    ConsumerConfig, Count, Processor, VersionGate,
};
use outbox_testkit::{unique, wait_until, TestDb};
use rdkafka::{
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    message::{Header, OwnedHeaders},
    producer::{FutureProducer, FutureRecord},
    ClientConfig,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

fn brokers() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("admin client")
}

/// Produces version `version` of order `aggregate` to `topic`, keyed by the aggregate.
async fn produce(producer: &FutureProducer, topic: &str, aggregate: &str, version: i64) {
    let mut headers = OwnedHeaders::new();
    for (k, v) in common::versioned_headers(Uuid::now_v7(), aggregate, version) {
        headers = headers.insert(Header {
            key: k,
            value: Some(&v),
        });
    }
    producer
        .send(
            FutureRecord::to(topic)
                .key(aggregate)
                .payload("{}")
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .expect("delivered");
}

/// Before: version 2, read from its topic before version 1 from the other, held the
/// aggregate's lane while it was retried in place, spent its attempts as a gap and was
/// dead-lettered; version 1 then applied alone: `[1]` and one dead letter.
#[tokio::test]
async fn an_aggregate_over_two_topics_applies_in_order_without_dead_letters() {
    let db = TestDb::new(4).await;
    let (placed, paid) = (unique("placed"), unique("paid"));
    let dead = format!("{placed}.dead");
    let created = admin()
        .create_topics(
            &[
                NewTopic::new(&placed, 1, TopicReplication::Fixed(1)),
                NewTopic::new(&paid, 1, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new(),
        )
        .await
        .expect("create topics");
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let group = unique("topics");
    let handler = Arc::new(Sequencer::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, &group, handler)
        .with_version_gate(VersionGate::starting_at(1));
    let metrics = processor.metrics().clone();
    let source = KafkaSource {
        dead_letter_topic: Some(dead.clone()),
        commit_interval: Duration::from_millis(100),
        ..KafkaSource::new(brokers(), &[&placed, &paid])
    };
    let config = ConsumerConfig {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        ..ConsumerConfig::new(&group)
    };
    let consumer = KafkaConsumer::connect(source, config, processor)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    // Version 2 (`paid`) arrives first; version 1 (`placed`) once the runner has met it.
    produce(&producer, &paid, "x", 2).await;
    wait_until("version 2 met", WAIT, || async {
        metrics.count(&group, Count::OutOfOrder) >= 1 || held_rows(&db).await == 1
    })
    .await;
    produce(&producer, &placed, "x", 1).await;
    produce(&producer, &placed, "x", 3).await;
    wait_until("three applied, or one dead", WAIT, || async {
        Ledger::count(&db).await == 3
            || (metrics.count(&group, Count::DeadLettered) > 0 && Ledger::count(&db).await >= 1)
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(metrics.count(&group, Count::DeadLettered), 0);
    assert_eq!(Ledger::applied(&db).await["x"], vec![1, 2, 3]);
    let _ = admin()
        .delete_topics(&[&placed, &paid, &dead], &AdminOptions::new())
        .await;
}
