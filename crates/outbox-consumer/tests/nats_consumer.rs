//! JetStream consumer runner against real NATS and PostgreSQL.

mod common;

use std::{sync::Arc, time::Duration};

use async_nats::{
    jetstream::{self, consumer::pull, stream},
    HeaderMap,
};
use common::{applied, distinct_applied, relay_headers, reserved, Ledger, ReserveStock};
use futures::StreamExt;
use outbox_consumer::{
    dead_letters::{nats::NatsDeadLetters, record_replay, Selection},
    nats::{NatsConsumer, NatsSource},
    ConsumerConfig, Count, Processor, VersionGate,
};
use outbox_testkit::{unique, wait_until, TestDb, NATS_URL};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

struct Fixture {
    js: jetstream::Context,
    stream: String,
    prefix: String,
}

impl Fixture {
    async fn new() -> Self {
        let js = jetstream::new(async_nats::connect(NATS_URL).await.unwrap());
        let stream = unique("C");
        let prefix = unique("c");
        js.create_stream(stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
        Self { js, stream, prefix }
    }

    /// Publishes like the relay; `msg_id` distinct per copy so JetStream keeps duplicates.
    async fn publish(&self, id: Uuid, event_type: &str, body: serde_json::Value, with_id: bool) {
        let mut headers = HeaderMap::new();
        for (k, v) in relay_headers(id, event_type) {
            if with_id || k != "event-id" {
                headers.insert(k, v.as_str());
            }
        }
        self.js
            .publish_with_headers(
                format!("{}.order.{event_type}", self.prefix),
                headers,
                serde_json::to_vec(&body).unwrap().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// Publishes one `OrderChanged` per (aggregate, version), as the relay would.
    async fn publish_versioned(&self, messages: &[common::Versioned]) {
        for (aggregate, version) in messages {
            let mut headers = HeaderMap::new();
            for (k, v) in common::versioned_headers(Uuid::now_v7(), aggregate, *version) {
                headers.insert(k, v.as_str());
            }
            self.js
                .publish_with_headers(
                    format!("{}.order.OrderChanged", self.prefix),
                    headers,
                    "{}".into(),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
    }

    fn config(&self, name: &str, max_attempts: u32) -> ConsumerConfig {
        ConsumerConfig {
            max_attempts,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
            ..ConsumerConfig::new(name)
        }
    }

    fn source(&self) -> NatsSource {
        NatsSource::new(NATS_URL, &self.stream)
    }

    async fn cleanup(self) {
        let _ = self.js.delete_stream(&self.stream).await;
        let _ = self
            .js
            .delete_stream(format!("{}_DEAD_inventory", self.stream))
            .await;
    }
}

#[tokio::test]
async fn every_event_delivered_several_times_changes_state_exactly_once() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let handler = Arc::new(ReserveStock::install(&db).await);
    let ids: Vec<Uuid> = (0..40).map(|_| Uuid::now_v7()).collect();
    for copy in 0..3 {
        for (i, id) in ids.iter().enumerate() {
            if copy < 2 || i % 4 == 0 {
                let body = serde_json::json!({ "sku": "apple", "qty": 1 });
                fx.publish(*id, "OrderPlaced", body, true).await;
            }
        }
    }
    let consumer = NatsConsumer::connect(
        fx.source(),
        fx.config("inventory", 5),
        common::processor(&db, "inventory", handler.clone()),
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    let js = fx.js.clone();
    let stream = fx.stream.clone();
    wait_until("all 90 deliveries acked", WAIT, || {
        let js = js.clone();
        let stream = stream.clone();
        async move {
            let s = js.get_stream(&stream).await.unwrap();
            let mut c: jetstream::consumer::Consumer<pull::Config> =
                s.get_consumer("inventory").await.unwrap();
            let info = c.info().await.unwrap();
            info.ack_floor.stream_sequence == 90
        }
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(applied(&db).await, 40, "each event applied once");
    assert_eq!(distinct_applied(&db).await, 40);
    assert_eq!(
        reserved(&db, "apple").await,
        40,
        "stock reserved once per order"
    );
    fx.cleanup().await;
}

#[tokio::test]
async fn a_handler_that_fails_then_succeeds_is_applied_once() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let mut handler = ReserveStock::install(&db).await;
    handler.fail_first = 2;
    let handler = Arc::new(handler);
    let ids: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    for id in &ids {
        fx.publish(
            *id,
            "OrderPlaced",
            serde_json::json!({"sku": "pear", "qty": 2}),
            true,
        )
        .await;
    }
    let consumer = NatsConsumer::connect(
        fx.source(),
        fx.config("inventory", 5),
        common::processor(&db, "inventory", handler.clone()),
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    wait_until("5 events applied", WAIT, || async {
        applied(&db).await == 5
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(reserved(&db, "pear").await, 10);
    for id in ids {
        assert_eq!(handler.calls(id), 3, "two failures, then the success");
    }
    fx.cleanup().await;
}

#[tokio::test]
async fn poison_and_malformed_messages_are_dead_lettered_while_later_ones_flow() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let mut handler = ReserveStock::install(&db).await;
    handler.poison_type = Some("Poison".into());
    let handler = Arc::new(handler);
    let poison = Uuid::now_v7();
    fx.publish(poison, "Poison", serde_json::json!({}), true)
        .await;
    fx.publish(Uuid::now_v7(), "NoId", serde_json::json!({}), false)
        .await;
    for _ in 0..10 {
        fx.publish(
            Uuid::now_v7(),
            "OrderPlaced",
            serde_json::json!({"sku": "apple", "qty": 1}),
            true,
        )
        .await;
    }
    let consumer = NatsConsumer::connect(
        fx.source(),
        fx.config("inventory", 3),
        common::processor(&db, "inventory", handler.clone()),
    )
    .await
    .unwrap();
    let dead_subject = consumer.dead_letter_subject().to_owned();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    wait_until("10 good events applied", WAIT, || async {
        applied(&db).await == 10
    })
    .await;
    let js = fx.js.clone();
    let dead_stream = format!("{}_DEAD_inventory", fx.stream);
    wait_until("two dead letters", WAIT, || {
        let js = js.clone();
        let name = dead_stream.clone();
        async move {
            let mut s = js.get_stream(&name).await.unwrap();
            s.info().await.unwrap().state.messages == 2
        }
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(handler.calls(poison), 3, "max_attempts deliveries");
    let mut reasons = Vec::new();
    let name = format!("{}_DEAD_inventory", fx.stream);
    let stream = fx.js.get_stream(&name).await.unwrap();
    for seq in 1..=2 {
        let m = stream.get_raw_message(seq).await.unwrap();
        assert_eq!(m.subject.as_str(), dead_subject);
        let h = m.headers;
        reasons.push((
            h.get("dead-letter-reason").unwrap().to_string(),
            h.get("dead-letter-attempts").unwrap().to_string(),
        ));
    }
    reasons.sort();
    assert_eq!(reasons[0].0, "cannot reserve: poison");
    assert_eq!(reasons[0].1, "3");
    assert_eq!(reasons[1].0, "malformed message: no event-id header");
    assert_eq!(reasons[1].1, "1");
    fx.cleanup().await;
}

#[tokio::test]
async fn a_consumer_killed_between_commit_and_ack_leaves_state_correct() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let handler = Arc::new(ReserveStock::install(&db).await);
    let id = Uuid::now_v7();
    fx.publish(
        id,
        "OrderPlaced",
        serde_json::json!({"sku": "apple", "qty": 3}),
        true,
    )
    .await;
    let processor = common::processor(&db, "inventory", handler.clone());
    let source = NatsSource {
        ack_wait: Duration::from_secs(1),
        ..fx.source()
    };
    // First life: receive, commit, die before the ack.
    {
        let stream = fx.js.get_stream(&fx.stream).await.unwrap();
        let consumer = stream
            .get_or_create_consumer(
                "inventory",
                pull::Config {
                    durable_name: Some("inventory".into()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: source.ack_wait,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
        let message = batch.next().await.unwrap().unwrap();
        let headers = message
            .headers
            .iter()
            .flat_map(|h| h.iter())
            .map(|(k, v)| (k.to_string(), v[0].as_str().to_owned()))
            .collect();
        let event =
            outbox_consumer::Envelope::decode("s", headers, message.payload.clone()).unwrap();
        processor.apply(&event.to_message()).await.unwrap();
        drop(message); // no ack: the process "died" here
    }
    assert_eq!(applied(&db).await, 1);
    // Second life: the redelivery is recognised by the inbox and acked.
    let consumer = NatsConsumer::connect(source, fx.config("inventory", 5), processor)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    let js = fx.js.clone();
    let stream = fx.stream.clone();
    wait_until("the redelivery to be acked", WAIT, || {
        let js = js.clone();
        let stream = stream.clone();
        async move {
            let s = js.get_stream(&stream).await.unwrap();
            let mut c: jetstream::consumer::Consumer<pull::Config> =
                s.get_consumer("inventory").await.unwrap();
            let info = c.info().await.unwrap();
            info.ack_floor.stream_sequence == 1 && info.num_ack_pending == 0
        }
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(applied(&db).await, 1, "applied once across the crash");
    assert_eq!(reserved(&db, "apple").await, 3);
    assert_eq!(handler.calls(id), 1, "the handler did not run again");
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
    let consumer = NatsConsumer::connect(
        fx.source(),
        fx.config("inventory", 2),
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
        .js
        .get_stream(format!("{}_DEAD_inventory", fx.stream))
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(dead, 0, "nothing dead-lettered");
    fx.cleanup().await;
}

/// Before: the panic unwound through the runner's task, which ended; its redelivery killed the
/// next runner the same way.
#[tokio::test]
async fn a_panicking_handler_fails_its_message_and_the_runner_goes_on() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let mut handler = ReserveStock::install(&db).await;
    handler.panic_type = Some("Explode".into());
    let handler = Arc::new(handler);
    let explode = Uuid::now_v7();
    fx.publish(explode, "Explode", serde_json::json!({}), true)
        .await;
    for _ in 0..3 {
        let body = serde_json::json!({"sku": "pear", "qty": 1});
        fx.publish(Uuid::now_v7(), "OrderPlaced", body, true).await;
    }
    let processor = common::processor(&db, "inventory", handler.clone());
    let metrics = processor.metrics().clone();
    let consumer = NatsConsumer::connect(fx.source(), fx.config("inventory", 2), processor)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    wait_until("3 events applied and 1 dead letter", WAIT, || async {
        applied(&db).await == 3 && metrics.count("inventory", Count::DeadLettered) == 1
    })
    .await;
    assert!(!task.is_finished(), "the runner is still running");
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(handler.calls(explode), 2, "max_attempts deliveries");
    assert_eq!(metrics.count("inventory", Count::Panics), 2);
    let stream = fx
        .js
        .get_stream(format!("{}_DEAD_inventory", fx.stream))
        .await
        .unwrap();
    let dead = stream.get_raw_message(1).await.unwrap();
    let reason = dead.headers.get("dead-letter-reason").unwrap().to_string();
    assert!(
        reason.starts_with("handler panicked: the handler's bug"),
        "{reason}"
    );
    fx.cleanup().await;
}

#[tokio::test]
async fn dead_letters_are_listed_and_replayed_once_fixed_and_audited() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let mut handler = ReserveStock::install(&db).await;
    handler.poison_type = Some("Poison".into());
    let handler = Arc::new(handler);
    let poison = Uuid::now_v7();
    let body = serde_json::json!({"sku": "apple", "qty": 7});
    fx.publish(poison, "Poison", body, true).await;
    for _ in 0..2 {
        let body = serde_json::json!({"sku": "pear", "qty": 1});
        fx.publish(Uuid::now_v7(), "OrderPlaced", body, true).await;
    }
    let processor = common::processor(&db, "inventory", handler.clone());
    let metrics = processor.metrics().clone();
    let consumer = NatsConsumer::connect(fx.source(), fx.config("inventory", 2), processor)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    wait_until("2 applied and 1 dead letter", WAIT, || async {
        applied(&db).await == 2 && metrics.count("inventory", Count::DeadLettered) == 1
    })
    .await;

    let dead = NatsDeadLetters::open(NATS_URL, &fx.stream, "inventory")
        .await
        .unwrap();
    let all = Selection {
        limit: 100,
        ..Default::default()
    };
    let listed = dead.list(&all).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].event_id, Some(poison.to_string()));
    assert_eq!(listed[0].reason, "cannot reserve: poison");
    assert_eq!(listed[0].origin, format!("{}.order.Poison", fx.prefix));
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
        "inventory",
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
    assert_eq!(reserved(&db, "apple").await, 7);
    assert!(
        dead.list(&all).await.unwrap().is_empty(),
        "replayed, removed"
    );
    let audit = common::replay_audit(&db).await;
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].0.as_str(), audit[0].1.as_str()),
        ("ops", "poison fixed")
    );
    assert_eq!(audit[0].2["event_ids"][0], poison.to_string());
    assert_eq!(audit[0].2["consumer"], "inventory");
    fx.cleanup().await;
}

/// Before (no version gate): `slow` version 1 failed and was NAKed, and versions 2 to 5 were
/// applied before it.
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
    let consumer = NatsConsumer::connect(fx.source(), fx.config("inventory", 5), processor)
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
    assert!(
        metrics.count("inventory", Count::OutOfOrder) > 0,
        "slow v2.. waited"
    );
    assert_eq!(metrics.count("inventory", Count::DeadLettered), 0);
    fx.cleanup().await;
}

/// Before: one message at a time, so the first four handlers, which wait for each other, never
/// met (each failed after 10 s).
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
        ..fx.config("inventory", 5)
    };
    let consumer = NatsConsumer::connect(fx.source(), config, processor)
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

/// Item 1: a producer whose ids are not UUIDs (a CloudEvent with `id` "order-42-placed").
/// Before: dead-lettered as "event-id … is not a UUID". Now: delivered twice, applied once,
/// its inbox row keyed by its source and id as sent (`ce:{length of source}:{source}{id}`),
/// with the event type.
#[tokio::test]
async fn a_cloudevent_with_a_text_id_is_applied_once() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let handler = Arc::new(ReserveStock::install(&db).await);
    for _ in 0..2 {
        let mut headers = HeaderMap::new();
        for (k, v) in [
            ("ce-specversion", "1.0"),
            ("ce-id", "order-42-placed"),
            ("ce-type", "OrderPlaced"),
            ("ce-source", "/legacy-shop"),
            ("content-type", "application/json"),
        ] {
            headers.insert(k, v);
        }
        fx.js
            .publish_with_headers(
                format!("{}.order.OrderPlaced", fx.prefix),
                headers,
                serde_json::to_vec(&serde_json::json!({"sku": "apple", "qty": 2}))
                    .unwrap()
                    .into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let processor = common::processor(&db, "inventory", handler.clone());
    let metrics = processor.metrics().clone();
    let consumer = NatsConsumer::connect(fx.source(), fx.config("inventory", 2), processor)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    wait_until("applied once, the copy skipped", WAIT, || async {
        metrics.count("inventory", Count::Handled) == 1
            && metrics.count("inventory", Count::Duplicates) == 1
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(reserved(&db, "apple").await, 2);
    assert_eq!(metrics.count("inventory", Count::DeadLettered), 0);
    let row: (String, Option<String>) = sqlx::query_as(
        &db.tables
            .render("SELECT event_id, event_type FROM {schema}.inbox WHERE consumer = 'inventory'"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        row,
        (
            "ce:12:/legacy-shoporder-42-placed".into(),
            Some("OrderPlaced".into())
        )
    );
    fx.cleanup().await;
}

/// A durable consumer created beforehand with a delivery limit (JetStream stops redelivering a
/// message after it: one released at shutdowns that often would never come back), without
/// explicit acks, delivering headers only or taking other subjects than the runner's is
/// refused by name, before any message is taken from it.
#[tokio::test]
async fn a_durable_that_would_lose_unapplied_messages_is_refused() {
    let db = TestDb::new(1).await;
    let fx = Fixture::new().await;
    let stream = fx.js.get_stream(&fx.stream).await.unwrap();
    let limited = pull::Config {
        durable_name: Some("limited".into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        max_deliver: 3,
        ..Default::default()
    };
    let unacked = pull::Config {
        durable_name: Some("unacked".into()),
        ack_policy: jetstream::consumer::AckPolicy::None,
        ..Default::default()
    };
    let headers = pull::Config {
        durable_name: Some("headers".into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        headers_only: true,
        ..Default::default()
    };
    let narrower = pull::Config {
        durable_name: Some("narrower".into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        filter_subject: format!("{}.order.Other", fx.prefix),
        ..Default::default()
    };
    let handler = Arc::new(ReserveStock::install(&db).await);
    for (config, setting) in [
        (limited, "max_deliver 3"),
        (unacked, "ack policy None"),
        (headers, "headers only"),
        (
            narrower,
            "order.Other but the runner's filter_subjects are every subject",
        ),
    ] {
        let name = config.durable_name.clone().unwrap();
        stream.create_consumer(config).await.unwrap();
        let processor = common::processor(&db, &name, handler.clone());
        let refused = NatsConsumer::connect(fx.source(), fx.config(&name, 3), processor)
            .await
            .err()
            .unwrap_or_else(|| panic!("durable {name} with {setting} accepted"));
        let text = refused.to_string();
        assert!(
            text.contains(&format!("durable consumer {name}")) && text.contains(setting),
            "{text}"
        );
        let _ = fx
            .js
            .delete_stream(format!("{}_DEAD_{name}", fx.stream))
            .await;
    }
    fx.cleanup().await;
}
