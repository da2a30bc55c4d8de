//! RabbitMQ consumer runner against real RabbitMQ and PostgreSQL.

mod common;

use std::{sync::Arc, time::Duration};

use common::{applied, relay_headers, reserved, Ledger, ReserveStock};
use futures::StreamExt;
use lapin::{
    options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::{AMQPValue, FieldTable, LongString},
    BasicProperties, Channel, Connection, ConnectionProperties,
};
use outbox_consumer::{
    dead_letters::{rabbitmq::RabbitMqDeadLetters, Selection},
    rabbitmq::{RabbitMqConsumer, RabbitMqSource},
    ConsumerConfig, Count, Processor, VersionGate,
};
use outbox_testkit::{unique, wait_until, TestDb, RABBITMQ_URL};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

struct Fixture {
    _conn: Connection,
    channel: Channel,
    queue: String,
}

impl Fixture {
    async fn new() -> Self {
        let conn = Connection::connect(RABBITMQ_URL, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        let queue = unique("q");
        channel
            .queue_declare(
                &queue,
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        Self {
            _conn: conn,
            channel,
            queue,
        }
    }

    async fn publish(&self, id: Uuid, event_type: &str, body: serde_json::Value, with_id: bool) {
        let mut table = FieldTable::default();
        for (k, v) in relay_headers(id, event_type) {
            if with_id || k != "event-id" {
                table.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
            }
        }
        self.channel
            .basic_publish(
                "",
                &self.queue,
                BasicPublishOptions::default(),
                &serde_json::to_vec(&body).unwrap(),
                BasicProperties::default().with_headers(table),
            )
            .await
            .unwrap();
    }

    /// Publishes one `OrderChanged` per (aggregate, version), as the relay would.
    async fn publish_versioned(&self, messages: &[common::Versioned]) {
        for (aggregate, version) in messages {
            let mut table = FieldTable::default();
            for (k, v) in common::versioned_headers(Uuid::now_v7(), aggregate, *version) {
                table.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
            }
            self.channel
                .basic_publish(
                    "",
                    &self.queue,
                    BasicPublishOptions::default(),
                    b"{}",
                    BasicProperties::default().with_headers(table),
                )
                .await
                .unwrap();
        }
    }

    fn config(&self, max_attempts: u32) -> ConsumerConfig {
        ConsumerConfig {
            max_attempts,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
            ..ConsumerConfig::new("inventory")
        }
    }

    /// Reads the dead-letter queue: (reason, attempts) per message.
    async fn dead_letters(&self, n: usize) -> Vec<(String, String)> {
        let mut consumer = self
            .channel
            .basic_consume(
                &format!("{}.dead", self.queue),
                "reader",
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut out = Vec::new();
        while out.len() < n {
            let d = tokio::time::timeout(WAIT, consumer.next())
                .await
                .expect("dead letter within the deadline")
                .unwrap()
                .unwrap();
            let h = d.properties.headers().clone().unwrap();
            let get = |k: &str| match h.inner().get(k) {
                Some(AMQPValue::LongString(s)) => {
                    String::from_utf8_lossy(s.as_bytes()).into_owned()
                }
                other => format!("{other:?}"),
            };
            out.push((get("dead-letter-reason"), get("dead-letter-attempts")));
        }
        out.sort();
        out
    }

    async fn cleanup(self) {
        for q in [self.queue.clone(), format!("{}.dead", self.queue)] {
            let _ = self
                .channel
                .queue_delete(&q, QueueDeleteOptions::default())
                .await;
        }
    }
}

#[tokio::test]
async fn redelivered_events_apply_once_and_poison_or_malformed_ones_are_dead_lettered() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let mut handler = ReserveStock::install(&db).await;
    handler.poison_type = Some("Poison".into());
    handler.fail_first = 1;
    let handler = Arc::new(handler);
    let ids: Vec<Uuid> = (0..20).map(|_| Uuid::now_v7()).collect();
    let poison = Uuid::now_v7();
    fx.publish(poison, "Poison", serde_json::json!({}), true)
        .await;
    fx.publish(Uuid::now_v7(), "NoId", serde_json::json!({}), false)
        .await;
    for copy in 0..2 {
        for id in &ids {
            let _ = copy;
            fx.publish(
                *id,
                "OrderPlaced",
                serde_json::json!({"sku": "pear", "qty": 1}),
                true,
            )
            .await;
        }
    }
    let consumer = RabbitMqConsumer::connect(
        RabbitMqSource::new(RABBITMQ_URL, &fx.queue),
        fx.config(3),
        common::processor(&db, "inventory", handler.clone()),
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    let dead = fx.dead_letters(2).await;
    wait_until("20 events applied", WAIT, || async {
        applied(&db).await == 20
    })
    .await;
    // Every copy was handled: the queue is empty and nothing is unacked.
    wait_until("the queue to empty", WAIT, || async {
        let q = fx
            .channel
            .queue_declare(
                &fx.queue,
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        q.message_count() == 0
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(
        applied(&db).await,
        20,
        "40 deliveries of 20 events: applied once each"
    );
    assert_eq!(reserved(&db, "pear").await, 20);
    assert_eq!(handler.calls(poison), 3);
    assert_eq!(dead[0], ("cannot reserve: poison".into(), "3".into()));
    assert_eq!(
        dead[1],
        ("malformed message: no event-id header".into(), "1".into())
    );
    fx.cleanup().await;
}

/// Before: every attempt during the outage counted, and with two attempts the five events were
/// dead-lettered within a second of the database going down.
#[tokio::test]
async fn a_database_outage_spends_no_attempt_and_dead_letters_nothing() {
    let mut outage = common::Outage::start("inventory").await;
    let fx = Fixture::new().await;
    let ids: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    for id in &ids {
        let body = serde_json::json!({"sku": "apple", "qty": 1});
        fx.publish(*id, "OrderPlaced", body, true).await;
    }
    outage.server.crash();
    let consumer = RabbitMqConsumer::connect(
        RabbitMqSource::new(RABBITMQ_URL, &fx.queue),
        fx.config(2),
        outage.processor.clone(),
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    outage.end_and_check(&ids).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    let dead = fx
        .channel
        .queue_declare(
            &format!("{}.dead", fx.queue),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!(dead.message_count(), 0, "nothing dead-lettered");
    fx.cleanup().await;
}

#[tokio::test]
async fn dead_letters_are_listed_and_replayed_once_fixed() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let mut handler = ReserveStock::install(&db).await;
    handler.poison_type = Some("Poison".into());
    let handler = Arc::new(handler);
    let poison = Uuid::now_v7();
    fx.publish(
        poison,
        "Poison",
        serde_json::json!({"sku": "apple", "qty": 7}),
        true,
    )
    .await;
    fx.publish(Uuid::now_v7(), "NoId", serde_json::json!({}), false)
        .await;
    let consumer = RabbitMqConsumer::connect(
        RabbitMqSource::new(RABBITMQ_URL, &fx.queue),
        fx.config(2),
        common::processor(&db, "inventory", handler.clone()),
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    let dead = RabbitMqDeadLetters::open(RABBITMQ_URL, &fx.queue)
        .await
        .unwrap();
    let all = Selection {
        limit: 100,
        ..Default::default()
    };
    wait_until("2 dead letters", WAIT, || async {
        dead.list(&all).await.unwrap().len() == 2
    })
    .await;
    let listed = dead.list(&all).await.unwrap();
    let reasons: Vec<&str> = listed.iter().map(|l| l.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "malformed message: no event-id header",
            "cannot reserve: poison"
        ],
        "in the order dead-lettered (the malformed one at once); listing keeps them"
    );
    handler
        .cured
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let only_poison = Selection {
        event_ids: vec![poison.to_string()],
        limit: 100,
        ..Default::default()
    };
    let replayed = dead.replay(&only_poison).await.unwrap().letters;
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].origin, fx.queue);
    wait_until("the replayed event applied", WAIT, || async {
        applied(&db).await == 1
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(reserved(&db, "apple").await, 7);
    let left = dead.list(&all).await.unwrap();
    assert_eq!(left.len(), 1, "the malformed one stays dead");
    assert_eq!(left[0].event_id, None);
    fx.cleanup().await;
}

/// Before (no version gate): `slow` version 1 failed and was requeued after its backoff, and
/// versions 2 to 5 were applied before it.
#[tokio::test]
async fn a_failing_aggregate_holds_only_itself_and_every_aggregate_applies_in_order() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let ledger = common::flaky_ledger(&db).await;
    let (messages, expected) = common::interleaved();
    fx.publish_versioned(&messages).await;
    let processor = Processor::new(db.pool.clone(), &db.tables, "inventory", ledger)
        .with_version_gate(VersionGate::starting_at(1));
    let metrics = processor.metrics().clone();
    let consumer = RabbitMqConsumer::connect(
        RabbitMqSource::new(RABBITMQ_URL, &fx.queue),
        fx.config(5),
        processor,
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    wait_until("every event applied", WAIT, || async {
        Ledger::count(&db).await == messages.len() as i64
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    common::assert_in_order(&Ledger::applied(&db).await, &expected);
    assert_eq!(
        metrics.count("inventory", Count::Failures),
        3,
        "slow v1 failed 3 times"
    );
    assert_eq!(metrics.count("inventory", Count::DeadLettered), 0);
    fx.cleanup().await;
}

/// Before: one delivery at a time, so the first four handlers, which wait for each other,
/// never met (each failed after 10 s).
#[tokio::test]
async fn aggregates_are_handled_at_once_each_in_order() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let ledger = Ledger::install(&db).await.meeting(4);
    let (messages, expected) = common::interleaved();
    fx.publish_versioned(&messages).await;
    // No version gate: the order below is the runner's own.
    let processor = Processor::new(db.pool.clone(), &db.tables, "inventory", Arc::new(ledger));
    let metrics = processor.metrics().clone();
    let config = ConsumerConfig {
        concurrency: 8,
        ..fx.config(5)
    };
    let consumer = RabbitMqConsumer::connect(
        RabbitMqSource::new(RABBITMQ_URL, &fx.queue),
        config,
        processor,
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    wait_until("every event applied", WAIT, || async {
        Ledger::count(&db).await == messages.len() as i64
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(
        metrics.count("inventory", Count::Failures),
        0,
        "the first four met"
    );
    common::assert_in_order(&Ledger::applied(&db).await, &expected);
    fx.cleanup().await;
}

/// A consumer killed mid-batch (its task aborted, its connection gone, while `slow` v1 keeps
/// failing and other aggregates are applied): the broker requeues what it held, and the next
/// consumer applies the rest. Every event once, each aggregate in order, counted from the
/// database.
#[tokio::test]
async fn a_consumer_killed_mid_batch_leaves_every_event_applied_once_in_order() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let mut stuck = Ledger::install(&db).await;
    stuck.flaky = vec!["slow".into()];
    stuck.fail_first = u32::MAX;
    let (messages, expected) = common::interleaved();
    fx.publish_versioned(&messages).await;
    let gated = |ledger: Ledger| {
        Processor::new(db.pool.clone(), &db.tables, "inventory", Arc::new(ledger))
            .with_version_gate(VersionGate::starting_at(1))
    };
    let consumer = RabbitMqConsumer::connect(
        RabbitMqSource::new(RABBITMQ_URL, &fx.queue),
        fx.config(u32::MAX),
        gated(stuck),
    )
    .await
    .unwrap();
    let task = tokio::spawn(consumer.run(CancellationToken::new()));
    wait_until("the other aggregates applied", WAIT, || async {
        Ledger::count(&db).await == messages.len() as i64 - 5
    })
    .await;
    // Killed once slow's first event has failed five times, however long the others took:
    // a runner that retries without limit (`u32::MAX`) keeps retrying it, never gives it up.
    let attempts = db
        .tables
        .render("SELECT max(attempts) FROM {schema}.consumer_held WHERE version = 1");
    wait_until("slow's first event failed five times", WAIT, || async {
        let most: Option<i32> = sqlx::query_scalar(&attempts)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        most.unwrap_or(0) >= 5
    })
    .await;
    task.abort();
    let _ = task.await;

    let second = gated(Ledger::on(&db));
    let metrics = second.metrics().clone();
    let consumer = RabbitMqConsumer::connect(
        RabbitMqSource::new(RABBITMQ_URL, &fx.queue),
        fx.config(u32::MAX),
        second,
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    wait_until("every event applied", WAIT, || async {
        Ledger::count(&db).await == messages.len() as i64
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    common::assert_in_order(&Ledger::applied(&db).await, &expected);
    assert_eq!(metrics.count("inventory", Count::Handled), 5, "slow's five");
    assert_eq!(metrics.count("inventory", Count::DeadLettered), 0);
    fx.cleanup().await;
}
