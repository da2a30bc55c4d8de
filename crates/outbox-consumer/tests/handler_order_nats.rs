//! Once and in order at the handler, through the NATS JetStream runner (real NATS and
//! PostgreSQL): a reordered first event, a gap wider than the consumer's ack window, the
//! CloudEvents envelope's lanes and ids, attempts counted only for real failures, and the
//! messages a runner keeps in hand while its database is down.

mod common;

use std::{sync::Arc, time::Duration};

use async_nats::{
    jetstream::{self, consumer::pull, stream},
    HeaderMap,
};
use common::{held_rows, Ledger, Sequencer};
use outbox_consumer::{
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
        let stream = unique("H");
        let prefix = unique("h");
        js.create_stream(stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
        Self { js, stream, prefix }
    }

    async fn publish(&self, headers: Vec<(String, String)>, body: &str) {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(k.as_str(), v.as_str());
        }
        self.js
            .publish_with_headers(
                format!("{}.order.OrderChanged", self.prefix),
                map,
                body.to_owned().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// Version `version` of order `aggregate`, with the relay's native headers.
    async fn version(&self, aggregate: &str, version: i64) {
        let headers = common::versioned_headers(Uuid::now_v7(), aggregate, version)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        self.publish(headers, "{}").await;
    }

    fn config(&self, name: &str, max_attempts: u32) -> ConsumerConfig {
        ConsumerConfig {
            max_attempts,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
            ..ConsumerConfig::new(name)
        }
    }

    /// Whether the durable consumer `name` has nothing left to deliver or to be acknowledged.
    async fn settled(&self, name: &str) -> bool {
        let mut consumer: jetstream::consumer::PullConsumer = self
            .js
            .get_stream(&self.stream)
            .await
            .unwrap()
            .get_consumer(name)
            .await
            .unwrap();
        let info = consumer.info().await.unwrap();
        info.num_pending == 0 && info.num_ack_pending == 0
    }

    async fn ack_pending(&self, name: &str) -> usize {
        let mut consumer: jetstream::consumer::PullConsumer = self
            .js
            .get_stream(&self.stream)
            .await
            .unwrap()
            .get_consumer(name)
            .await
            .unwrap();
        consumer.info().await.unwrap().num_ack_pending
    }

    fn start(
        &self,
        consumer: NatsConsumer,
    ) -> (
        CancellationToken,
        tokio::task::JoinHandle<Result<(), outbox_consumer::Error>>,
    ) {
        let stop = CancellationToken::new();
        (stop.clone(), tokio::spawn(consumer.run(stop)))
    }

    async fn cleanup(self, name: &str) {
        let _ = self.js.delete_stream(&self.stream).await;
        let _ = self
            .js
            .delete_stream(format!("{}_DEAD_{name}", self.stream))
            .await;
    }
}

/// Waits until the broker has nothing in flight for `name` and the consumer holds nothing:
/// whatever was going to be applied has been.
async fn quiet(fx: &Fixture, db: &TestDb, name: &str) {
    wait_until("the consumer settled", WAIT, || async {
        fx.settled(name).await && held_rows(db).await == 0
    })
    .await;
}

/// Before: with `from_first_seen`, version 1 failed once and was NAKed, version 2 ran meanwhile
/// and became the aggregate's start, and version 1's redelivery was acknowledged as a
/// duplicate: applied `[2]`, version 1 never applied nor dead-lettered.
#[tokio::test]
async fn a_first_event_that_fails_once_is_applied_before_its_successor() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let handler = Arc::new(Sequencer::install(&db).await.failing("x", 1, 1));
    fx.version("x", 1).await;
    fx.version("x", 2).await;
    let processor = Processor::new(db.pool.clone(), &db.tables, "first-seen", handler)
        .with_version_gate(VersionGate::from_first_seen());
    let metrics = processor.metrics().clone();
    let consumer = NatsConsumer::connect(
        NatsSource::new(NATS_URL, &fx.stream),
        fx.config("first-seen", 5),
        processor,
    )
    .await
    .unwrap();
    let (stop, task) = fx.start(consumer);
    wait_until("two applications or a settled consumer", WAIT, || async {
        Ledger::count(&db).await == 2
            || (Ledger::count(&db).await >= 1
                && fx.settled("first-seen").await
                && held_rows(&db).await == 0)
    })
    .await;
    quiet(&fx, &db, "first-seen").await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(Ledger::applied(&db).await["x"], vec![1, 2]);
    assert_eq!(metrics.count("first-seen", Count::DeadLettered), 0);
    fx.cleanup("first-seen").await;
}

/// Before: the events waiting for version 1 of `g` stayed unacknowledged (NAKed with a delay)
/// and filled the consumer's `max_ack_pending` of 20: `h`'s events behind them were never
/// delivered, nor was `g`'s version 1 once published.
#[tokio::test]
async fn a_gap_wider_than_the_ack_window_stops_no_other_aggregate() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    // The operator's durable consumer, with a small window: the runner binds to it.
    fx.js
        .get_stream(&fx.stream)
        .await
        .unwrap()
        .create_consumer(pull::Config {
            durable_name: Some("window".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            max_ack_pending: 20,
            ..Default::default()
        })
        .await
        .unwrap();
    for version in 2..=41 {
        fx.version("g", version).await;
    }
    for version in 1..=3 {
        fx.version("h", version).await;
    }
    let handler = Arc::new(Sequencer::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, "window", handler)
        .with_version_gate(VersionGate::starting_at(1));
    let consumer = NatsConsumer::connect(
        NatsSource::new(NATS_URL, &fx.stream),
        fx.config("window", 5),
        processor,
    )
    .await
    .unwrap();
    let (stop, task) = fx.start(consumer);
    wait_until(
        "h applied while g waits for its version 1",
        Duration::from_secs(30),
        || async { Ledger::applied(&db).await.get("h").map(Vec::len) == Some(3) },
    )
    .await;
    fx.version("g", 1).await;
    wait_until("g applied once its version 1 arrived", WAIT, || async {
        Ledger::applied(&db).await.get("g").map(Vec::len) == Some(41)
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    let applied = Ledger::applied(&db).await;
    assert_eq!(applied["g"], (1..=41).collect::<Vec<_>>());
    assert_eq!(applied["h"], vec![1, 2, 3]);
    assert_eq!(held_rows(&db).await, 0);
    fx.cleanup("window").await;
}

/// Before: a CloudEvents message carried no `aggregate-type`/`aggregate-id` headers, so each
/// had a lane of its own and two of one aggregate ran at once.
#[tokio::test]
async fn cloudevents_of_one_aggregate_run_one_at_a_time_in_order() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let handler = Arc::new(
        Sequencer::install(&db)
            .await
            .meeting_for(Duration::from_millis(500)),
    );
    for version in 1..=4 {
        let id = Uuid::now_v7().to_string();
        let headers = common::cloudevent_headers("ce-", &id, "/outbox/order", "x", None);
        fx.publish(headers, &format!("{{\"n\":{version}}}")).await;
    }
    let processor = Processor::new(db.pool.clone(), &db.tables, "ce-lanes", handler.clone());
    let consumer = NatsConsumer::connect(
        NatsSource::new(NATS_URL, &fx.stream),
        fx.config("ce-lanes", 5),
        processor,
    )
    .await
    .unwrap();
    let (stop, task) = fx.start(consumer);
    wait_until("four applied", WAIT, || async {
        Ledger::count(&db).await == 4
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(handler.most_at_once("x"), 1, "one message of x at a time");
    fx.cleanup("ce-lanes").await;
}

/// Before: the inbox keyed CloudEvents on `id` alone, so a second producer's event with the
/// same `id` (another `source`) was acknowledged as a duplicate and never applied.
#[tokio::test]
async fn cloudevents_of_two_sources_with_one_id_are_both_applied() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let handler = Arc::new(Sequencer::install(&db).await);
    for (source, aggregate) in [("/shop-a", "a"), ("/shop-b", "b")] {
        let headers = common::cloudevent_headers("ce-", "order-1", source, aggregate, None);
        fx.publish(headers, "{}").await;
    }
    let processor = Processor::new(db.pool.clone(), &db.tables, "ce-ids", handler);
    let metrics = processor.metrics().clone();
    let consumer = NatsConsumer::connect(
        NatsSource::new(NATS_URL, &fx.stream),
        fx.config("ce-ids", 5),
        processor,
    )
    .await
    .unwrap();
    let (stop, task) = fx.start(consumer);
    quiet(&fx, &db, "ce-ids").await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(metrics.count("ce-ids", Count::Duplicates), 0);
    assert_eq!(Ledger::count(&db).await, 2, "one application per source");
    fx.cleanup("ce-ids").await;
}

/// Before: attempts were the server's delivery count, which the version gate's waits had
/// raised: version 2 waited through 4 deliveries for version 1, then failed once for real and
/// was dead-lettered at once (`max_attempts` 3).
#[tokio::test]
async fn only_real_failures_count_as_attempts() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let handler = Arc::new(Sequencer::install(&db).await.failing("x", 2, 1));
    let processor = Processor::new(db.pool.clone(), &db.tables, "attempts", handler)
        .with_version_gate(VersionGate::starting_at(1));
    let metrics = processor.metrics().clone();
    let consumer = NatsConsumer::connect(
        NatsSource::new(NATS_URL, &fx.stream),
        fx.config("attempts", 3),
        processor,
    )
    .await
    .unwrap();
    let (stop, task) = fx.start(consumer);
    fx.version("x", 2).await;
    wait_until("version 2 waited", WAIT, || async {
        metrics.count("attempts", Count::OutOfOrder) >= 4 || held_rows(&db).await == 1
    })
    .await;
    fx.version("x", 1).await;
    wait_until("both applied or one dead", WAIT, || async {
        Ledger::count(&db).await == 2 || metrics.count("attempts", Count::DeadLettered) > 0
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(metrics.count("attempts", Count::DeadLettered), 0);
    assert_eq!(Ledger::applied(&db).await["x"], vec![1, 2]);
    fx.cleanup("attempts").await;
}

/// Before: while the database was down the runner kept taking messages of its few busy
/// aggregates into their lanes' queues (room was counted in lanes): 600 unacknowledged at
/// once. Now it holds at most `max_in_hand` (the consumer's `max_ack_pending`).
#[tokio::test]
async fn a_database_outage_keeps_at_most_max_in_hand_messages() {
    let mut outage = common::Outage::start("in-hand").await;
    let fx = Fixture::new().await;
    outage.server.crash();
    for n in 0..600 {
        let headers = common::versioned_headers(Uuid::now_v7(), ["p", "q"][n % 2], 0)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .filter(|(k, _)| k != "aggregate-version")
            .collect();
        fx.publish(headers, r#"{"sku":"apple","qty":1}"#).await;
    }
    let consumer = NatsConsumer::connect(
        NatsSource::new(NATS_URL, &fx.stream),
        fx.config("in-hand", 5),
        outage.processor.clone(),
    )
    .await
    .unwrap();
    let (stop, task) = fx.start(consumer);
    let metrics = outage.processor.metrics().clone();
    wait_until("the runner met the outage", WAIT, || {
        let tries = metrics.count("in-hand", Count::InfrastructureFailures);
        async move { tries >= 4 }
    })
    .await;
    // The window as full as the runner lets it get: unchanged over ten polls in a row.
    let (mut last, mut same) = (0, 0);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = fx.ack_pending("in-hand").await;
        same = if now == last { same + 1 } else { 0 };
        last = now;
        if now > 0 && same >= 10 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the window never settled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // 256: the default `max_in_hand`.
    assert!(last <= 256, "{last} messages in hand");
    outage.server.start_again().await;
    wait_until("all applied", WAIT, || async {
        common::applied(&outage.db).await == 600
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    fx.cleanup("in-hand").await;
}

/// The runner keeps its own inbox bounded: this consumer's rows older than the retention go,
/// the rows of events it still holds stay (they are their claim on the event), and another
/// consumer's rows are not its to delete.
#[tokio::test]
async fn the_runner_purges_its_own_inbox_after_the_retention() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    db.exec(
        "INSERT INTO {schema}.inbox (consumer, event_id, event_type, processed_at)
         SELECT c, 'old-' || c || '-' || n, 'T', now() - interval '2 days'
         FROM unnest(ARRAY['retention', 'other']) c, generate_series(1, 2500) n",
    )
    .await;
    let handler = Arc::new(Sequencer::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, "retention", handler)
        .with_version_gate(VersionGate::starting_at(1));
    // Version 2 of `g` is held (version 1 never comes): its inbox row must survive.
    fx.version("g", 2).await;
    let metrics = processor.metrics().clone();
    let config = ConsumerConfig {
        inbox_retention: Some(Duration::from_secs(3600)),
        purge_interval: Duration::from_millis(200),
        ..fx.config("retention", 5)
    };
    let consumer = NatsConsumer::connect(NatsSource::new(NATS_URL, &fx.stream), config, processor)
        .await
        .unwrap();
    let (stop, task) = fx.start(consumer);
    wait_until("the held event", WAIT, || async {
        held_rows(&db).await == 1
    })
    .await;
    // Held an hour ago, as far as retention can tell.
    db.exec("UPDATE {schema}.inbox SET processed_at = now() - interval '2 days' WHERE event_id NOT LIKE 'old-%'")
        .await;
    let count = |consumer: &'static str| {
        let db = &db;
        async move {
            sqlx::query_scalar::<_, i64>(
                &db.tables
                    .render("SELECT count(*) FROM {schema}.inbox WHERE consumer = $1"),
            )
            .bind(consumer)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        }
    };
    wait_until("the old rows purged", WAIT, || async {
        count("retention").await == 1
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(count("other").await, 2500, "another consumer's rows stay");
    assert_eq!(held_rows(&db).await, 1);
    assert_eq!(metrics.count("retention", Count::InboxPurged), 2500);
    fx.cleanup("retention").await;
}
