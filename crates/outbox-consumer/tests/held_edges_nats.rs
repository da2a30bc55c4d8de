//! Held events at their edges, through the NATS JetStream runner (real NATS and PostgreSQL):
//! the state rows of aggregates the gate does not track, an event given up while its dead
//! letter cannot be stored, redeliveries of first-seen aggregates that are still settling,
//! a first-seen aggregate whose version 1 is dead-lettered on its first attempt, a held event
//! whose retry hangs, events with an aggregate type and no id, and CloudEvents with a subject
//! and no aggregate type.

mod common;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use async_nats::{
    jetstream::{
        self,
        consumer::{pull, PullConsumer},
        stream, AckKind,
    },
    HeaderMap,
};
use common::{held_rows, Ledger, Scripted, Sequencer, Step};
use futures::StreamExt;
use outbox_consumer::{
    nats::{NatsConsumer, NatsSource},
    versions::{ConsumerVersions, Filter},
    ConsumerConfig, Count, Processor, VersionGate,
};
use outbox_testkit::{unique, wait_until, TestDb, NATS_URL};
use tokio_util::sync::{CancellationToken, DropGuard};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// One test's stream and subject prefix; the stream and the dead-letter streams of the
/// consumers it started are deleted when it is dropped, whether the test passed or not.
struct Fixture {
    js: jetstream::Context,
    stream: String,
    prefix: String,
    consumers: Mutex<Vec<String>>,
}

impl Fixture {
    async fn new() -> Self {
        let js = jetstream::new(async_nats::connect(NATS_URL).await.unwrap());
        let stream = unique("E");
        let prefix = unique("e");
        js.create_stream(stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
        Self {
            js,
            stream,
            prefix,
            consumers: Mutex::new(Vec::new()),
        }
    }

    /// Publishes an empty JSON body with `headers`, confirmed by the stream.
    async fn publish<K: AsRef<str>>(&self, headers: &[(K, String)]) {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(k.as_ref(), v.as_str());
        }
        self.js
            .publish_with_headers(format!("{}.order.Changed", self.prefix), map, "{}".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// The dead-letter stream of consumer `name`.
    fn dead_stream(&self, name: &str) -> String {
        format!("{}_DEAD_{name}", self.stream)
    }

    /// Starts a runner of consumer `config.name` on this stream.
    async fn start(
        &self,
        source: NatsSource,
        config: ConsumerConfig,
        processor: Processor,
    ) -> Runner {
        self.consumers.lock().unwrap().push(config.name.clone());
        let consumer = NatsConsumer::connect(source, config, processor)
            .await
            .unwrap();
        let stop = CancellationToken::new();
        Runner {
            task: tokio::spawn(consumer.run(stop.clone())),
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
        }
    }

    /// Whether the durable consumer `name` has nothing left to deliver or to be acknowledged.
    async fn settled(&self, name: &str) -> bool {
        let mut consumer: PullConsumer = self
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
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let mut streams = vec![self.stream.clone()];
        for name in self.consumers.lock().unwrap().iter() {
            streams.push(self.dead_stream(name));
        }
        // Drop cannot await: a thread with its own runtime deletes the streams.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(client) = async_nats::connect(NATS_URL).await {
                    let js = jetstream::new(client);
                    for stream in streams {
                        let _ = js.delete_stream(stream).await;
                    }
                }
            });
        })
        .join();
    }
}

/// A running consumer, asked to stop when dropped: a failing test's runner then ends its
/// transactions (on the multi-thread runtime the tests use) and its schema can be dropped.
struct Runner {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), outbox_consumer::Error>>,
    _stop_on_drop: DropGuard,
}

impl Runner {
    /// Asks the runner to stop and checks that it does, without an error.
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the runner stops when asked")
            .unwrap()
            .unwrap();
    }
}

/// Quick retries and sweeps.
fn config(name: &str) -> ConsumerConfig {
    ConsumerConfig {
        max_attempts: 5,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        sweep_interval: Duration::from_millis(200),
        ..ConsumerConfig::new(name)
    }
}

/// An event of aggregate type `kind` (and id `id`, if any) without a version.
fn unversioned(kind: &str, id: Option<&str>) -> Vec<(&'static str, String)> {
    let mut headers = common::relay_headers(Uuid::now_v7(), "OrderChanged");
    headers.retain(|(k, _)| !k.starts_with("aggregate-"));
    headers.push(("aggregate-type", kind.to_owned()));
    if let Some(id) = id {
        headers.push(("aggregate-id", id.to_owned()));
    }
    headers
}

fn tools(db: &TestDb, name: &str) -> ConsumerVersions {
    ConsumerVersions::new(db.pool.clone(), &db.tables, name)
}

fn everything() -> Filter {
    Filter {
        limit: 1000,
        ..Default::default()
    }
}

/// 50 aggregates the gate does not track each fail their first attempt, are held, and are
/// applied by the sweep: none keeps a state row once nothing of it is held, so the version
/// state (and `consumer-versions list`) does not grow with every aggregate ever retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_rows_of_untracked_aggregates_go_once_nothing_of_them_is_held() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let name = "untracked";
    let aggregates: Vec<String> = (0..50).map(|n| format!("a{n}")).collect();
    let mut sequencer = Sequencer::install(&db).await;
    for aggregate in &aggregates {
        sequencer = sequencer.failing(aggregate, -1, 1);
    }
    let processor = Processor::new(db.pool.clone(), &db.tables, name, Arc::new(sequencer));
    let metrics = processor.metrics().clone();
    let runner = fx
        .start(
            NatsSource::new(NATS_URL, &fx.stream),
            config(name),
            processor,
        )
        .await;
    for aggregate in &aggregates {
        fx.publish(&unversioned("order", Some(aggregate))).await;
    }
    wait_until("every aggregate applied", WAIT, || async {
        Ledger::count(&db).await == 50 && held_rows(&db).await == 0 && fx.settled(name).await
    })
    .await;
    runner.stop().await;
    let expected: HashMap<String, Vec<i64>> =
        aggregates.iter().map(|a| (a.clone(), vec![-1])).collect();
    assert_eq!(Ledger::applied(&db).await, expected, "each applied once");
    assert_eq!(metrics.count(name, Count::Failures), 50, "each failed once");
    assert_eq!(metrics.count(name, Count::Handled), 50);
    let state_rows: i64 = sqlx::query_scalar(
        &db.tables
            .render("SELECT count(*) FROM {schema}.consumer_versions"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(state_rows, 0, "state rows left behind");
    let listed = tools(&db, name).list(&everything()).await.unwrap();
    assert!(
        listed.is_empty(),
        "`consumer-versions list` shows {listed:?}"
    );
}

/// An event given up while its dead-letter stream refuses the letter stays held as dead: the
/// `held_dead` gauge and `consumer-versions held` show it until the letter is stored, so an
/// event applied nowhere is never invisible. Once the stream takes it, it is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_up_event_whose_dead_letter_cannot_be_stored_stays_visible_as_held_dead() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let name = "undeliverable";
    // The dead-letter stream exists already and refuses every letter (a full or misconfigured
    // stream; the same as a broker refusing publishes for any reason).
    let refusing = stream::Config {
        name: fx.dead_stream(name),
        subjects: vec![format!("dead.{}.{name}", fx.stream)],
        max_message_size: 1,
        ..Default::default()
    };
    fx.js.create_stream(refusing.clone()).await.unwrap();
    let handler = Arc::new(Sequencer::install(&db).await.failing("x", -1, 100));
    let processor = Processor::new(db.pool.clone(), &db.tables, name, handler);
    let metrics = processor.metrics().clone();
    let runner = fx
        .start(
            NatsSource::new(NATS_URL, &fx.stream),
            ConsumerConfig {
                max_attempts: 2,
                ..config(name)
            },
            processor,
        )
        .await;
    fx.publish(&unversioned("order", Some("x"))).await;
    wait_until("the given-up event counted as held dead", WAIT, || async {
        metrics.held_dead(name) == 1
    })
    .await;
    let held = tools(&db, name).held(&everything()).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    let event = &held[0];
    assert!(event.dead, "{event:?}");
    assert_eq!(event.aggregate_id.as_deref(), Some("x"));
    assert_eq!(event.attempts, 2);
    assert_eq!(
        event.reason, "x v-1 fails on purpose",
        "the dead letter's reason"
    );
    assert!(
        event
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("storing its dead letter failed")),
        "{event:?}"
    );
    assert_eq!(metrics.held(name).0, 0, "nothing held for a retry");
    assert_eq!(metrics.count(name, Count::DeadLettered), 0);
    assert_eq!(Ledger::count(&db).await, 0);

    // The dead-letter stream takes letters again: the next sweep stores it.
    fx.js
        .update_stream(stream::Config {
            max_message_size: -1,
            ..refusing
        })
        .await
        .unwrap();
    wait_until("the dead letter stored", WAIT, || async {
        metrics.count(name, Count::DeadLettered) == 1
            && metrics.held_dead(name) == 0
            && held_rows(&db).await == 0
    })
    .await;
    runner.stop().await;
    let mut dead = fx.js.get_stream(fx.dead_stream(name)).await.unwrap();
    assert_eq!(dead.info().await.unwrap().state.messages, 1, "stored once");
    assert_eq!(metrics.count(name, Count::DeadLettered), 1);
}

/// A first-seen consumer restarted with 64 messages redelivered (one full sweep batch), each
/// the first of an aggregate still settling: they wait out the settle time without filling
/// every sweep, so another aggregate's retry runs at once, long before they settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_of_settling_aggregates_do_not_hold_back_another_aggregates_retry() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let name = "settling";
    let stream = fx.js.get_stream(&fx.stream).await.unwrap();
    let earlier: PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    for n in 0..64 {
        fx.publish(&common::versioned_headers(
            Uuid::now_v7(),
            &format!("a{n}"),
            5,
        ))
        .await;
    }
    // An earlier runner took them all and gave them back unapplied: each comes again as a
    // redelivery.
    let mut batch = earlier
        .batch()
        .max_messages(64)
        .expires(Duration::from_secs(10))
        .messages()
        .await
        .unwrap();
    let mut taken = Vec::new();
    while let Some(message) = batch.next().await {
        taken.push(message.unwrap());
    }
    assert_eq!(taken.len(), 64);
    for message in &taken {
        message.ack_with(AckKind::Nak(None)).await.unwrap();
    }
    let handler = Arc::new(Sequencer::install(&db).await.failing("z", 1, 1));
    // Settling far longer than the test runs: what is applied below was not waiting for it.
    let processor = Processor::new(db.pool.clone(), &db.tables, name, handler)
        .with_version_gate(VersionGate::from_first_seen().settle(Duration::from_secs(600)));
    let metrics = processor.metrics().clone();
    let runner = fx
        .start(
            NatsSource::new(NATS_URL, &fx.stream),
            config(name),
            processor,
        )
        .await;
    wait_until("the 64 redeliveries held", WAIT, || async {
        held_rows(&db).await == 64
    })
    .await;
    // Version 1 of an ordinary aggregate fails once: held for a retry due in 20-40 ms.
    fx.publish(&common::versioned_headers(Uuid::now_v7(), "z", 1))
        .await;
    wait_until("z's retry applied", WAIT, || async {
        Ledger::applied(&db).await.contains_key("z")
    })
    .await;
    runner.stop().await;
    assert_eq!(
        Ledger::applied(&db).await,
        HashMap::from([("z".to_owned(), vec![1])]),
        "only z applied: the others settle"
    );
    assert_eq!(held_rows(&db).await, 64, "the redeliveries still settling");
    assert_eq!(metrics.count(name, Count::Failures), 1);
}

/// With a first-seen gate, version 1 of an aggregate comes first and fails for good on its
/// first attempt (dead-lettered at once): the aggregate then starts at version 1 and waits for
/// its replay, so version 2 is held "waiting for version 1"; the replay of version 1 (the same
/// event, the handler fixed) is applied, then version 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_seen_version_1_dead_lettered_live_waits_for_its_replay() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let name = "firstlive";
    let handler = Arc::new(
        Scripted::install(&db)
            .await
            .script("x", 1, &[Step::Permanent]),
    );
    let processor = Processor::new(db.pool.clone(), &db.tables, name, handler.clone())
        .with_version_gate(VersionGate::from_first_seen().settle(Duration::from_millis(300)));
    let metrics = processor.metrics().clone();
    let runner = fx
        .start(
            NatsSource::new(NATS_URL, &fx.stream),
            config(name),
            processor,
        )
        .await;
    let v1 = common::versioned_headers(Uuid::now_v7(), "x", 1);
    fx.publish(&v1).await;
    wait_until("version 1 dead-lettered", WAIT, || async {
        metrics.count(name, Count::DeadLettered) == 1
    })
    .await;
    fx.publish(&common::versioned_headers(Uuid::now_v7(), "x", 2))
        .await;
    let tools = tools(&db, name);
    wait_until("version 2 held", WAIT, || async {
        !tools.held(&everything()).await.unwrap().is_empty()
    })
    .await;
    let held = tools.held(&everything()).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (
            held[0].version,
            held[0].reason.as_str(),
            held[0].next_attempt_at,
            held[0].attempts,
        ),
        (Some(2), "waiting for version 1", None, 0),
        "{held:?}"
    );
    let state = tools.list(&everything()).await.unwrap();
    assert_eq!(state.len(), 1, "{state:?}");
    assert_eq!(
        (state[0].version, state[0].first_version),
        (None, Some(1)),
        "the aggregate starts at version 1: {state:?}"
    );
    assert_eq!(Ledger::count(&db).await, 0);

    // The operator replays version 1 (the same event), the handler fixed.
    fx.publish(&v1).await;
    wait_until("both applied", WAIT, || async {
        Ledger::count(&db).await == 2 && held_rows(&db).await == 0 && fx.settled(name).await
    })
    .await;
    runner.stop().await;
    assert_eq!(
        Ledger::applied(&db).await,
        HashMap::from([("x".to_owned(), vec![1, 2])])
    );
    assert_eq!((handler.calls("x", 1), handler.calls("x", 2)), (2, 1));
    assert_eq!(metrics.count(name, Count::DeadLettered), 1);
    let mut dead = fx.js.get_stream(fx.dead_stream(name)).await.unwrap();
    assert_eq!(
        dead.info().await.unwrap().state.messages,
        1,
        "one dead letter"
    );
}

/// A held event whose retry hangs (its handler waits, as on a lock or a dependency without a
/// timeout) holds only its own aggregate: another aggregate's retry is applied while it
/// hangs, and the `outbox_consumer_held` gauge says what is held meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_held_event_holds_only_its_own_aggregate_and_the_gauges_stay_current() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let name = "slowheld";
    // The wait inside the handler is the scenario; it ends when the test releases it.
    let handler = Arc::new(
        Scripted::install(&db)
            .await
            .script("a", -1, &[Step::Fail, Step::Hang])
            .script("b", -1, &[Step::Fail]),
    );
    // A failing test releases the hang too, so that its runner's transaction ends.
    let _release_on_drop = handler.release.clone().drop_guard();
    let processor = Processor::new(db.pool.clone(), &db.tables, name, handler.clone());
    let metrics = processor.metrics().clone();
    let runner = fx
        .start(
            NatsSource::new(NATS_URL, &fx.stream),
            config(name),
            processor,
        )
        .await;
    fx.publish(&unversioned("order", Some("a"))).await;
    wait_until("a's retry hangs", WAIT, || async {
        handler.calls("a", -1) == 2
    })
    .await;
    fx.publish(&unversioned("order", Some("b"))).await;
    wait_until("b's retry applied", WAIT, || async {
        Ledger::applied(&db).await.contains_key("b")
    })
    .await;
    wait_until("the gauge shows a held", WAIT, || async {
        metrics.held(name).0 == 1 && held_rows(&db).await == 1
    })
    .await;
    assert_eq!(handler.calls("a", -1), 2, "a still hangs");
    assert_eq!(
        Ledger::applied(&db).await,
        HashMap::from([("b".to_owned(), vec![-1])]),
        "b applied while a hangs"
    );
    assert_eq!(handler.calls("b", -1), 2);

    handler.release.cancel();
    wait_until("a applied", WAIT, || async {
        Ledger::count(&db).await == 2
            && held_rows(&db).await == 0
            && metrics.held(name).0 == 0
            && fx.settled(name).await
    })
    .await;
    runner.stop().await;
    assert_eq!(
        Ledger::applied(&db).await,
        HashMap::from([("a".to_owned(), vec![-1]), ("b".to_owned(), vec![-1])])
    );
    assert_eq!(handler.calls("a", -1), 2);
    assert_eq!(metrics.count(name, Count::Failures), 2);
    assert_eq!(metrics.count(name, Count::Handled), 2);
    assert_eq!(metrics.count(name, Count::DeadLettered), 0);
}

/// An event with an aggregate type and no aggregate id is held on its own when its first
/// attempt fails, and the sweep tries it again and applies it (never left due and untried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_with_a_type_and_no_id_that_fails_once_is_tried_again_and_applied() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let name = "idless";
    // The sequencer keys such an event as ("", -1).
    let handler = Arc::new(Sequencer::install(&db).await.failing("", -1, 1));
    let processor = Processor::new(db.pool.clone(), &db.tables, name, handler);
    let metrics = processor.metrics().clone();
    let runner = fx
        .start(
            NatsSource::new(NATS_URL, &fx.stream),
            config(name),
            processor,
        )
        .await;
    fx.publish(&unversioned("order", None)).await;
    wait_until("the event applied", WAIT, || async {
        Ledger::count(&db).await == 1 && held_rows(&db).await == 0 && fx.settled(name).await
    })
    .await;
    runner.stop().await;
    assert_eq!(
        Ledger::applied(&db).await,
        HashMap::from([(String::new(), vec![-1])])
    );
    assert_eq!(metrics.count(name, Count::Failures), 1);
    assert_eq!(metrics.count(name, Count::Held), 1);
    assert_eq!(metrics.count(name, Count::Handled), 1);
    assert_eq!(metrics.count(name, Count::DeadLettered), 0);
}

/// 64 events with a type and no id (one full sweep batch) fail once each, then an ordinary
/// aggregate's event fails once: every one of them is tried again and applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_of_id_less_retries_and_another_aggregates_retry_are_all_applied() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let name = "batch";
    let handler = Arc::new(
        Sequencer::install(&db)
            .await
            .failing("", -1, 64)
            .failing("z", -1, 1),
    );
    let processor = Processor::new(db.pool.clone(), &db.tables, name, handler);
    let metrics = processor.metrics().clone();
    let runner = fx
        .start(
            NatsSource::new(NATS_URL, &fx.stream),
            config(name),
            processor,
        )
        .await;
    for n in 0..64 {
        fx.publish(&unversioned(&format!("kind{n}"), None)).await;
    }
    wait_until("the 64 first attempts failed", WAIT, || async {
        metrics.count(name, Count::Failures) == 64
    })
    .await;
    fx.publish(&unversioned("order", Some("z"))).await;
    wait_until("all applied", WAIT, || async {
        Ledger::count(&db).await == 65 && held_rows(&db).await == 0 && fx.settled(name).await
    })
    .await;
    runner.stop().await;
    assert_eq!(
        Ledger::applied(&db).await,
        HashMap::from([(String::new(), vec![-1; 64]), ("z".to_owned(), vec![-1])])
    );
    assert_eq!(metrics.count(name, Count::Failures), 65);
    assert_eq!(metrics.count(name, Count::Handled), 65);
    assert_eq!(metrics.count(name, Count::DeadLettered), 0);
}

/// CloudEvents from another producer with a `subject` and an `aggregateversion` but no
/// `aggregatetype`: the version gate orders them by subject, so version 2 waits for version
/// 1's retry and both are applied in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_with_a_subject_and_no_aggregate_type_are_applied_in_version_order() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let name = "subject";
    let handler = Arc::new(Sequencer::install(&db).await.failing("x", 1, 1));
    let processor = Processor::new(db.pool.clone(), &db.tables, name, handler)
        .with_version_gate(VersionGate::starting_at(1));
    let runner = fx
        .start(
            NatsSource::new(NATS_URL, &fx.stream),
            config(name),
            processor,
        )
        .await;
    for version in 1..=2 {
        let mut headers = common::cloudevent_headers(
            "ce-",
            &Uuid::now_v7().to_string(),
            "/shop",
            "x",
            Some(version),
        );
        headers.retain(|(k, _)| k != "ce-aggregatetype");
        fx.publish(&headers).await;
    }
    wait_until("both applied", WAIT, || async {
        Ledger::count(&db).await == 2 && held_rows(&db).await == 0 && fx.settled(name).await
    })
    .await;
    runner.stop().await;
    assert_eq!(Ledger::applied(&db).await["x"], vec![1, 2]);
    let aggregates = tools(&db, name).list(&everything()).await.unwrap();
    assert_eq!(aggregates.len(), 1, "{aggregates:?}");
    let x = &aggregates[0];
    assert_eq!(
        (
            x.aggregate_type.as_str(),
            x.aggregate_id.as_str(),
            x.version,
            x.held
        ),
        ("", "x", Some(2), 0),
        "gated as an aggregate without a type: {x:?}"
    );
}

/// A version the inbox cannot record (an event type of 300 characters) is dead-lettered at
/// once and leaves its aggregate's start alone: version 1, the gate's start, arriving after it
/// is applied (an event given up before the gate let it through never moves the start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_later_version_leaves_the_start_to_version_1() {
    let db = TestDb::new(4).await;
    let fx = Fixture::new().await;
    let name = "refused";
    let processor = Processor::new(
        db.pool.clone(),
        &db.tables,
        name,
        Arc::new(Ledger::install(&db).await),
    )
    .with_version_gate(VersionGate::starting_at(1));
    let metrics = processor.metrics().clone();
    let runner = fx
        .start(
            NatsSource::new(NATS_URL, &fx.stream),
            config(name),
            processor,
        )
        .await;
    let mut refused = common::versioned_headers(Uuid::now_v7(), "x", 2);
    refused.retain(|(k, _)| *k != "event-type");
    refused.push(("event-type", "T".repeat(300)));
    fx.publish(&refused).await;
    wait_until("version 2 dead-lettered", WAIT, || async {
        metrics.count(name, Count::DeadLettered) == 1 && fx.settled(name).await
    })
    .await;
    let tools = tools(&db, name);
    assert!(
        tools
            .list(&everything())
            .await
            .unwrap()
            .iter()
            .all(|s| s.first_version.is_none()),
        "no start recorded"
    );
    fx.publish(&common::versioned_headers(Uuid::now_v7(), "x", 1))
        .await;
    wait_until("version 1 applied", WAIT, || async {
        Ledger::count(&db).await == 1 && fx.settled(name).await
    })
    .await;
    runner.stop().await;
    assert_eq!(
        Ledger::applied(&db).await,
        HashMap::from([("x".to_owned(), vec![1])])
    );
    assert_eq!(
        metrics.count(name, Count::DeadLettered),
        1,
        "only version 2"
    );
    let mut dead = fx.js.get_stream(fx.dead_stream(name)).await.unwrap();
    assert_eq!(dead.info().await.unwrap().state.messages, 1);
}
