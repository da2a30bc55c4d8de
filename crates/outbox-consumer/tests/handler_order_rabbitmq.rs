//! Once and in order at the handler, through the RabbitMQ runner (real RabbitMQ and
//! PostgreSQL): a gap wider than the prefetch window, the CloudEvents envelope's lanes, a
//! quorum queue's delivery limit, and the dead-letter queue's type.

mod common;

use std::{sync::Arc, time::Duration};

use common::{held_rows, Ledger, Sequencer};
use lapin::{
    options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::{AMQPValue, FieldTable, LongString},
    BasicProperties, Channel, Connection, ConnectionProperties,
};
use outbox_consumer::{
    dead_letters::{rabbitmq::RabbitMqDeadLetters, Selection},
    rabbitmq::{QueueType, RabbitMqConsumer, RabbitMqSource},
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
    /// A classic queue of its own.
    async fn new() -> Self {
        Self::with_arguments(FieldTable::default()).await
    }

    /// A durable queue of its own, declared with `arguments`.
    async fn with_arguments(arguments: FieldTable) -> Self {
        let conn = Connection::connect(RABBITMQ_URL, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        let queue = unique("hq");
        channel
            .queue_declare(
                &queue,
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await
            .unwrap();
        Self {
            _conn: conn,
            channel,
            queue,
        }
    }

    async fn publish(&self, headers: Vec<(String, String)>, body: &str) {
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
        }
        self.channel
            .basic_publish(
                "",
                &self.queue,
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default().with_headers(table),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

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

    /// Messages ready in the queue (not counting those delivered and unacknowledged).
    async fn ready(&self) -> u32 {
        self.channel
            .queue_declare(
                &self.queue,
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count()
    }

    async fn run(
        &self,
        config: ConsumerConfig,
        processor: Processor,
    ) -> (
        CancellationToken,
        tokio::task::JoinHandle<Result<(), outbox_consumer::Error>>,
    ) {
        let consumer = RabbitMqConsumer::connect(
            RabbitMqSource::new(RABBITMQ_URL, &self.queue),
            config,
            processor,
        )
        .await
        .unwrap();
        let stop = CancellationToken::new();
        (stop.clone(), tokio::spawn(consumer.run(stop)))
    }

    async fn cleanup(self) {
        for queue in [format!("{}.dead", self.queue), self.queue.clone()] {
            let _ = self
                .channel
                .queue_delete(&queue, QueueDeleteOptions::default())
                .await;
        }
    }
}

/// Before: `g`'s events waiting for version 1 were requeued at the head of the queue after
/// each backoff and cycled through the prefetch window (16), so `h`'s events behind them
/// were never delivered, nor `g`'s version 1 once published.
#[tokio::test]
async fn a_gap_wider_than_the_prefetch_window_stops_no_other_aggregate() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    for version in 2..=41 {
        fx.version("g", version).await;
    }
    for version in 1..=3 {
        fx.version("h", version).await;
    }
    let handler = Arc::new(Sequencer::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, "prefetch", handler)
        .with_version_gate(VersionGate::starting_at(1));
    let (stop, task) = fx.run(fx.config("prefetch", 5), processor).await;
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
    fx.cleanup().await;
}

/// Before: the runner read the aggregate from `aggregate-type`/`aggregate-id` headers only, so
/// CloudEvents (`cloudEvents:subject`, `cloudEvents:aggregatetype`) of one aggregate ran at once.
#[tokio::test]
async fn cloudevents_of_one_aggregate_run_one_at_a_time() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let handler = Arc::new(
        Sequencer::install(&db)
            .await
            .meeting_for(Duration::from_millis(500)),
    );
    for _ in 1..=4 {
        let id = Uuid::now_v7().to_string();
        let headers = common::cloudevent_headers("cloudEvents:", &id, "/outbox/order", "x", None);
        fx.publish(headers, "{}").await;
    }
    let processor = Processor::new(db.pool.clone(), &db.tables, "ce-lanes", handler.clone());
    let (stop, task) = fx.run(fx.config("ce-lanes", 5), processor).await;
    wait_until("four applied", WAIT, || async {
        Ledger::count(&db).await == 4
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(handler.most_at_once("x"), 1, "one message of x at a time");
    fx.cleanup().await;
}

/// Before: on a quorum queue with a delivery limit (RabbitMQ 4's default is 20; 1 here) the
/// version gate's requeues of a waiting version 2 spent the limit and the broker dropped it
/// (two deliveries, then nothing): version 2 gone without a dead letter.
#[tokio::test]
async fn a_quorum_queues_delivery_limit_drops_no_waiting_event() {
    let db = TestDb::new(4).await;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    arguments.insert("x-delivery-limit".into(), AMQPValue::LongInt(1));
    let fx = Fixture::with_arguments(arguments).await;
    let handler = Arc::new(Sequencer::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, "quorum", handler)
        .with_version_gate(VersionGate::starting_at(1));
    let metrics = processor.metrics().clone();
    let (stop, task) = fx.run(fx.config("quorum", 5), processor).await;
    fx.version("x", 2).await;
    wait_until("version 2 waited", WAIT, || async {
        metrics.count("quorum", Count::OutOfOrder) >= 4 || held_rows(&db).await == 1
    })
    .await;
    fx.version("x", 1).await;
    wait_until("both applied, or the queue drained", WAIT, || async {
        let applied = Ledger::count(&db).await;
        applied == 2 || (applied == 1 && fx.ready().await == 0 && held_rows(&db).await == 0)
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(Ledger::applied(&db).await["x"], vec![1, 2]);
    fx.cleanup().await;
}

/// Messages ready in `queue`.
async fn ready_in(channel: &Channel, queue: &str) -> u32 {
    channel
        .queue_declare(
            queue,
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_or(0, |q| q.message_count())
}

/// The dead-letter queue is declared with the type asked for, not the virtual host's default: a
/// quorum one takes the dead letter, keeps it however often it is listed (and refuses to be
/// declared classic), and a runner asking for another type than the queue has is told so by
/// name instead of using it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_letter_queue_has_the_type_asked_for() {
    let db = TestDb::new(2).await;
    let fx = Fixture::new().await;
    let handler = Arc::new(Sequencer::install(&db).await);
    let source = |kind| RabbitMqSource {
        dead_letter_queue_type: kind,
        ..RabbitMqSource::new(RABBITMQ_URL, &fx.queue)
    };
    let processor = Processor::new(db.pool.clone(), &db.tables, "typed", handler.clone());
    let consumer =
        RabbitMqConsumer::connect(source(QueueType::Quorum), fx.config("typed", 3), processor)
            .await
            .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    // No event id: it cannot be decoded, and is dead-lettered at once.
    fx.publish(vec![("event-type".into(), "Broken".into())], "{}")
        .await;
    let dead = format!("{}.dead", fx.queue);
    wait_until("the dead letter stored", WAIT, || async {
        ready_in(&fx.channel, &dead).await == 1
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    // Listing returns each letter to the queue, a delivery each time: on a quorum queue with a
    // delivery limit it reaches (or -1, which RabbitMQ before 4.0 takes as 0), the letter goes.
    let letters = RabbitMqDeadLetters::open(RABBITMQ_URL, &fx.queue)
        .await
        .unwrap();
    for listing in 1..=25 {
        let listed = letters
            .list(&Selection {
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(listed.len(), 1, "listing {listing}: {listed:?}");
    }
    drop(letters);

    let mut classic = FieldTable::default();
    classic.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("classic")),
    );
    let other = fx._conn.create_channel().await.unwrap();
    let redeclared = other
        .queue_declare(
            &dead,
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            classic,
        )
        .await;
    assert!(
        redeclared.is_err(),
        "the dead-letter queue is a quorum queue"
    );

    let processor = Processor::new(db.pool.clone(), &db.tables, "typed", handler);
    let refused =
        RabbitMqConsumer::connect(source(QueueType::Classic), fx.config("typed", 3), processor)
            .await
            .err()
            .expect("a classic dead-letter queue is refused where a quorum one is");
    assert!(
        refused.to_string().contains(&dead)
            && refused.to_string().contains("dead_letter_queue_type"),
        "{refused}"
    );
    assert_eq!(
        ready_in(&fx.channel, &dead).await,
        1,
        "the dead letter kept"
    );
    fx.cleanup().await;
}
