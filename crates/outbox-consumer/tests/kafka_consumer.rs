//! Kafka consumer runner against a real Kafka-protocol broker (tansu, `scripts/tools/kafka.sh`;
//! `OUTBOX_TEST_KAFKA_BROKERS` overrides it) and PostgreSQL. Each test has its own topics,
//! consumer group and schema, and deletes its topics at the end.
#![cfg(feature = "kafka")]

mod common;

use std::{sync::Arc, time::Duration};

use common::{applied, relay_headers, Ledger, ReserveStock};
use outbox_consumer::{
    dead_letters::{kafka::KafkaDeadLetters, record_replay, Selection},
    kafka::{KafkaConsumer, KafkaSource},
    ConsumerConfig, Count, Processor,
};
use outbox_testkit::{unique, wait_until, TestDb};
use rdkafka::{
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{BaseConsumer, Consumer},
    message::{Header, Headers, Message as _, OwnedHeaders},
    producer::{FutureProducer, FutureRecord},
    ClientConfig, Offset, TopicPartitionList,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);
/// Partitions of the consumed topic: several, so that aggregates share and interleave them.
const PARTITIONS: i32 = 3;

fn brokers() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

struct Fixture {
    topic: String,
    dead: String,
    group: String,
    producer: FutureProducer,
}

impl Fixture {
    async fn new() -> Self {
        let topic = unique("kc");
        let fx = Self {
            dead: format!("{topic}.dead"),
            group: unique("inventory"),
            producer: ClientConfig::new()
                .set("bootstrap.servers", brokers())
                .create()
                .expect("producer"),
            topic,
        };
        let admin = admin();
        let created = admin
            .create_topics(
                &[NewTopic::new(
                    &fx.topic,
                    PARTITIONS,
                    TopicReplication::Fixed(1),
                )],
                &AdminOptions::new(),
            )
            .await
            .expect("create topic");
        assert!(created.iter().all(Result::is_ok), "{created:?}");
        fx
    }

    /// Produces one record keyed like the relay (the aggregate id) and waits for its delivery.
    async fn publish(&self, key: &str, headers: Vec<(&str, String)>, body: serde_json::Value) {
        let mut h = OwnedHeaders::new();
        for (k, v) in &headers {
            h = h.insert(Header {
                key: k,
                value: Some(v),
            });
        }
        let payload = serde_json::to_vec(&body).unwrap();
        self.producer
            .send(
                FutureRecord::to(&self.topic)
                    .key(key)
                    .payload(&payload)
                    .headers(h),
                Duration::from_secs(10),
            )
            .await
            .expect("delivered");
    }

    /// One `OrderChanged` per (aggregate, version), keyed by aggregate, as the relay would.
    async fn publish_versioned(&self, messages: &[common::Versioned]) {
        for (aggregate, version) in messages {
            let headers = common::versioned_headers(Uuid::now_v7(), aggregate, *version);
            self.publish(aggregate, headers, serde_json::json!({}))
                .await;
        }
    }

    fn source(&self) -> KafkaSource {
        KafkaSource {
            dead_letter_topic: Some(self.dead.clone()),
            commit_interval: Duration::from_millis(100),
            ..KafkaSource::new(brokers(), &[&self.topic])
        }
    }

    fn config(&self, max_attempts: u32) -> ConsumerConfig {
        ConsumerConfig {
            max_attempts,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
            ..ConsumerConfig::new(&self.group)
        }
    }

    /// Starts a runner with `processor`; its task and the token that stops it.
    async fn run(
        &self,
        processor: Processor,
        max_attempts: u32,
    ) -> (
        CancellationToken,
        tokio::task::JoinHandle<Result<(), outbox_consumer::Error>>,
    ) {
        let consumer = KafkaConsumer::connect(self.source(), self.config(max_attempts), processor)
            .await
            .unwrap();
        assert_eq!(consumer.dead_letter_topic(), self.dead);
        let stop = CancellationToken::new();
        (stop.clone(), tokio::spawn(consumer.run(stop)))
    }

    /// The dead letters' headers, read from the start of the dead-letter topic.
    async fn dead_letters(&self, n: usize) -> Vec<std::collections::BTreeMap<String, String>> {
        let dead = self.dead.clone();
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", brokers())
                .set("group.id", unique("dead-reader"))
                .set("enable.auto.commit", "false")
                .create()
                .unwrap();
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(&dead, 0, Offset::Beginning)
                .unwrap();
            consumer.assign(&list).unwrap();
            let deadline = std::time::Instant::now() + WAIT;
            let mut out = Vec::new();
            while out.len() < n && std::time::Instant::now() < deadline {
                let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
                    continue;
                };
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                let value = h.value.unwrap_or_default();
                                (
                                    h.key.to_owned(),
                                    String::from_utf8_lossy(value).into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(headers);
            }
            out
        })
        .await
        .unwrap()
    }

    async fn cleanup(self) {
        let _ = admin()
            .delete_topics(&[&self.topic, &self.dead], &AdminOptions::new())
            .await;
    }
}

fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("admin client")
}

/// 50 aggregates flow while `slow` fails its first three attempts: each aggregate applies in
/// order, `slow` included, with no version gate (Kafka's partition order and the runner's
/// lanes are the only order).
#[tokio::test]
async fn a_failing_aggregate_holds_only_itself_and_every_aggregate_applies_in_order() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let ledger = common::flaky_ledger(&db).await;
    let (messages, expected) = common::interleaved();
    fx.publish_versioned(&messages).await;
    let processor = Processor::new(db.pool.clone(), &db.tables, &fx.group, ledger);
    let metrics = processor.metrics().clone();
    let (stop, task) = fx.run(processor, 5).await;
    wait_until("every event applied", WAIT, || async {
        Ledger::count(&db).await == messages.len() as i64
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    common::assert_in_order(&Ledger::applied(&db).await, &expected);
    assert_eq!(metrics.count(&fx.group, Count::Failures), 3, "slow v1");
    assert_eq!(metrics.count(&fx.group, Count::DeadLettered), 0);
    assert_eq!(
        metrics.count(&fx.group, Count::Handled),
        messages.len() as u64
    );
    fx.cleanup().await;
}

/// A malformed message and a poison one go to the dead-letter topic with their reasons; the
/// others flow, and the committed offsets pass all of them: a new member of the group does not
/// see them again.
#[tokio::test]
async fn poison_and_malformed_messages_are_dead_lettered_while_later_ones_flow() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let mut handler = ReserveStock::install(&db).await;
    handler.poison_type = Some("Poison".into());
    let handler = Arc::new(handler);
    let poison = Uuid::now_v7();
    let apple = || serde_json::json!({"sku": "apple", "qty": 1});
    fx.publish(
        "o-1",
        relay_headers(poison, "Poison"),
        serde_json::json!({}),
    )
    .await;
    let mut no_id = relay_headers(Uuid::now_v7(), "NoId");
    no_id.retain(|(k, _)| *k != "event-id");
    fx.publish("o-1", no_id, serde_json::json!({})).await;
    for _ in 0..10 {
        fx.publish("o-1", relay_headers(Uuid::now_v7(), "OrderPlaced"), apple())
            .await;
    }
    let processor = common::processor(&db, &fx.group, handler.clone());
    let metrics = processor.metrics().clone();
    let (stop, task) = fx.run(processor, 3).await;
    wait_until("10 good events applied", WAIT, || async {
        applied(&db).await == 10
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(handler.calls(poison), 3, "max_attempts tries");
    assert_eq!(metrics.count(&fx.group, Count::DeadLettered), 2);
    let mut letters = fx.dead_letters(2).await;
    assert_eq!(letters.len(), 2);
    letters.sort_by_key(|h| h["dead-letter-reason"].clone());
    assert_eq!(letters[0]["dead-letter-reason"], "cannot reserve: poison");
    assert_eq!(letters[0]["dead-letter-attempts"], "3");
    assert_eq!(letters[0]["event-id"], poison.to_string());
    assert_eq!(letters[0]["dead-letter-topic"], fx.topic);
    assert_eq!(letters[0]["dead-letter-consumer"], fx.group);
    assert_eq!(
        letters[1]["dead-letter-reason"],
        "malformed message: no event-id header"
    );
    assert_eq!(letters[1]["dead-letter-attempts"], "1");

    // The group's offsets passed them: a new member sees only what comes next.
    let (stop, task) = fx
        .run(common::processor(&db, &fx.group, handler.clone()), 3)
        .await;
    let last = Uuid::now_v7();
    fx.publish("o-1", relay_headers(last, "OrderPlaced"), apple())
        .await;
    wait_until("the next event applied", WAIT, || async {
        applied(&db).await == 11
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(handler.calls(poison), 3, "not delivered again");
    assert_eq!(common::reserved(&db, "apple").await, 11);
    fx.cleanup().await;
}

/// A runner stopped mid-batch, `slow` v1 failing every attempt: `slow`'s five events are held
/// in the database (v1 for its next attempt, the others behind it), so its partition's offset
/// moved on. The next runner reads nothing again and applies the five from the database:
/// every event once, each aggregate in order. (Before: the partition stayed committed up to
/// `slow` v1, and the next runner read everything behind it again.)
#[tokio::test]
async fn a_runner_stopped_mid_batch_leaves_every_event_applied_once_in_order() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let mut stuck = Ledger::install(&db).await;
    stuck.flaky = vec!["slow".into()];
    stuck.fail_first = u32::MAX;
    let (messages, expected) = common::interleaved();
    fx.publish_versioned(&messages).await;
    let first = Processor::new(db.pool.clone(), &db.tables, &fx.group, Arc::new(stuck));
    let (_, task) = fx.run(first, u32::MAX).await;
    // Everything but `slow`'s five versions.
    wait_until("the other aggregates applied", WAIT, || async {
        Ledger::count(&db).await == messages.len() as i64 - 5
    })
    .await;
    // Not stuck in its partition: `slow` v1 failed its first attempt and is held in the
    // database, its four successors behind it; the partition's offset moved past them all.
    wait_until("slow's five held", WAIT, || async {
        common::held_rows(&db).await == 5
    })
    .await;
    task.abort();
    let _ = task.await;

    let second = Processor::new(
        db.pool.clone(),
        &db.tables,
        &fx.group,
        Arc::new(Ledger::on(&db)),
    );
    let metrics = second.metrics().clone();
    // Without limit, as the first: `slow` v1's failed attempts are counted in the database, so
    // a limit of five here would give it up whenever the first runner had made five.
    let (stop, task) = fx.run(second, u32::MAX).await;
    wait_until("every event applied", WAIT, || async {
        Ledger::count(&db).await == messages.len() as i64
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    common::assert_in_order(&Ledger::applied(&db).await, &expected);
    assert_eq!(
        metrics.count(&fx.group, Count::Handled),
        5,
        "slow's five, from the database"
    );
    assert_eq!(common::held_rows(&db).await, 0);
    fx.cleanup().await;
}

/// A second member joins while events flow: partitions move between the two (events keep
/// coming, one version of 20 aggregates per round, until the newcomer has handled some), and
/// each event is still applied once, each aggregate in order.
#[tokio::test]
async fn a_member_joining_mid_stream_keeps_every_event_once_and_in_order() {
    let db = TestDb::new(8).await;
    let fx = Fixture::new().await;
    let ledger = Arc::new(Ledger::install(&db).await);
    let aggregates: Vec<String> = (0..20).map(|n| format!("a{n}")).collect();
    let round = |version: i64| -> Vec<common::Versioned> {
        aggregates.iter().map(|a| (a.clone(), version)).collect()
    };
    let mut rounds = 0;
    for _ in 0..3 {
        rounds += 1;
        fx.publish_versioned(&round(rounds)).await;
    }
    let a = Processor::new(db.pool.clone(), &db.tables, &fx.group, ledger.clone());
    let (stop_a, task_a) = fx.run(a, 5).await;
    wait_until("the first rounds applied", WAIT, || async {
        Ledger::count(&db).await == 60
    })
    .await;
    let b = Processor::new(db.pool.clone(), &db.tables, &fx.group, ledger);
    let b_metrics = b.metrics().clone();
    let (stop_b, task_b) = fx.run(b, 5).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while b_metrics.count(&fx.group, Count::Handled) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second member never took a partition"
        );
        rounds += 1;
        fx.publish_versioned(&round(rounds)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And a few more rounds once both members share the partitions.
    for _ in 0..3 {
        rounds += 1;
        fx.publish_versioned(&round(rounds)).await;
    }
    let total = rounds * aggregates.len() as i64;
    wait_until("every event applied", WAIT, || async {
        Ledger::count(&db).await == total
    })
    .await;
    stop_a.cancel();
    stop_b.cancel();
    task_a.await.unwrap().unwrap();
    task_b.await.unwrap().unwrap();
    let expected: Vec<common::Versioned> = aggregates.iter().map(|a| (a.clone(), rounds)).collect();
    common::assert_in_order(&Ledger::applied(&db).await, &expected);
    fx.cleanup().await;
}

/// The database goes down with events waiting: the runner holds them and retries until it is
/// back, spending no attempt (`max_attempts` 2) and dead-lettering nothing.
#[tokio::test]
async fn a_database_outage_spends_no_attempt_and_dead_letters_nothing() {
    let fx = Fixture::new().await;
    let mut outage = common::Outage::start(&fx.group).await;
    let ids: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    for id in &ids {
        let body = serde_json::json!({"sku": "apple", "qty": 1});
        fx.publish("o-1", relay_headers(*id, "OrderPlaced"), body)
            .await;
    }
    outage.server.crash();
    let (stop, task) = fx.run(outage.processor.clone(), 2).await;
    outage.end_and_check(&ids).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    fx.cleanup().await;
}

#[tokio::test]
async fn reserved_properties_are_refused_with_their_name() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(ReserveStock::install(&db).await);
    let mut source = KafkaSource::new(brokers(), &["t"]);
    source
        .properties
        .insert("enable.auto.commit".into(), "true".into());
    let err = KafkaConsumer::connect(
        source,
        ConsumerConfig::new("inventory"),
        common::processor(&db, "inventory", handler),
    )
    .await
    .err()
    .expect("refused")
    .to_string();
    assert!(
        err.contains("kafka.properties.\"enable.auto.commit\""),
        "{err}"
    );
}

/// A poison event is dead-lettered; once fixed, replay sends it back to its topic (its
/// aggregate's partition), where the running consumer applies it once; the letter is marked
/// replayed and no longer listed, and the replay is audited.
#[tokio::test]
async fn dead_letters_are_listed_and_replayed_once_fixed_and_audited() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let mut handler = ReserveStock::install(&db).await;
    handler.poison_type = Some("Poison".into());
    let handler = Arc::new(handler);
    let poison = Uuid::now_v7();
    let body = serde_json::json!({"sku": "apple", "qty": 7});
    fx.publish("o-1", relay_headers(poison, "Poison"), body)
        .await;
    for _ in 0..2 {
        let body = serde_json::json!({"sku": "pear", "qty": 1});
        fx.publish("o-2", relay_headers(Uuid::now_v7(), "OrderPlaced"), body)
            .await;
    }
    let processor = common::processor(&db, &fx.group, handler.clone());
    let metrics = processor.metrics().clone();
    let (stop, task) = fx.run(processor, 2).await;
    wait_until("2 applied and 1 dead letter", WAIT, || async {
        applied(&db).await == 2 && metrics.count(&fx.group, Count::DeadLettered) == 1
    })
    .await;

    let dead = KafkaDeadLetters::open(&brokers(), &fx.dead).await.unwrap();
    let all = Selection {
        limit: 100,
        ..Default::default()
    };
    let listed = dead.list(&all).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].event_id, Some(poison.to_string()));
    assert_eq!(listed[0].reason, "cannot reserve: poison");
    assert_eq!(listed[0].origin, fx.topic);
    let other = Selection {
        event_ids: vec![Uuid::now_v7().to_string()],
        limit: 100,
        ..Default::default()
    };
    assert!(dead.replay(&other).await.unwrap().letters.is_empty());

    handler
        .cured
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let replayed = dead.replay(&all).await.unwrap().letters;
    assert_eq!(replayed, listed);
    record_replay(
        &db.pool,
        &db.tables,
        &fx.group,
        &dead.source(),
        &replayed,
        "ops",
        "poison fixed",
    )
    .await
    .unwrap();
    wait_until("the replayed event applied", WAIT, || async {
        applied(&db).await == 3
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(common::reserved(&db, "apple").await, 7);
    assert!(
        dead.list(&all).await.unwrap().is_empty(),
        "marked replayed, no longer listed"
    );
    assert!(dead.replay(&all).await.unwrap().letters.is_empty());
    let audit = common::replay_audit(&db).await;
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].2["event_ids"][0], poison.to_string());
    assert_eq!(audit[0].2["source"], format!("kafka topic {}", fx.dead));
    fx.cleanup().await;
}
