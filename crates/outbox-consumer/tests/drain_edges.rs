//! The drain of held events at its edges, through the processor and `apply_due` as a runner's
//! sweeper calls them (real PostgreSQL): outages of a handler's dependency, a try that fails at
//! its commit, a first-seen aggregate whose first version is dead-lettered, dead letters that
//! cannot be stored, header values with NUL, one event in two envelopes, the largest and the
//! smallest aggregate versions, and an operator's seed racing a runner's first hold.

mod common;

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use common::{held_rows, Ledger, Scripted, Step};
use futures::future::BoxFuture;
use outbox_consumer::{
    versions::{self, Change, ConsumerVersions, Filter, Seed},
    ConsumerConfig, Count, DeadLetters, Envelope, Handler, HandlerError, Message, Outcome,
    Processor, VersionGate,
};
use outbox_testkit::{wait_until, TestDb};
use sqlx::{postgres::PgPoolOptions, PgConnection};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

const NAME: &str = "drain";

/// Version `version` of order `aggregate`, with an empty JSON payload.
fn event(aggregate: &str, version: Option<i64>) -> Envelope {
    let event_id = Uuid::now_v7();
    Envelope {
        event_id,
        message_id: event_id.to_string(),
        event_type: "OrderChanged".into(),
        schema_version: 1,
        aggregate_type: Some("order".into()),
        aggregate_id: Some(aggregate.into()),
        aggregate_version: version,
        occurred_at: None,
        copy_of_schema_version: None,
        destination: "order.OrderChanged".into(),
        headers: BTreeMap::new(),
        payload: Bytes::from_static(b"{}"),
    }
}

/// A dead letter as the drain stored it.
#[derive(Clone, Debug)]
struct Letter {
    reason: String,
    attempts: u32,
    message: Message,
}

/// Dead letters kept in memory; refuses the first `refuse` stores.
#[derive(Default)]
struct Letters {
    stored: Mutex<Vec<Letter>>,
    refuse: Mutex<u32>,
    refused: Mutex<u32>,
}

impl Letters {
    fn refusing(refuse: u32) -> Self {
        Self {
            refuse: Mutex::new(refuse),
            ..Self::default()
        }
    }

    fn stored(&self) -> Vec<Letter> {
        self.stored.lock().unwrap().clone()
    }

    fn refused(&self) -> u32 {
        *self.refused.lock().unwrap()
    }
}

impl DeadLetters for Letters {
    fn dead_letter<'a>(
        &'a self,
        message: &'a Message,
        reason: &'a str,
        attempts: u32,
        _origin: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            {
                let mut refuse = self.refuse.lock().unwrap();
                if *refuse > 0 {
                    *refuse -= 1;
                    *self.refused.lock().unwrap() += 1;
                    return Err("broker: connection refused (dead-letter destination down)".into());
                }
            }
            self.stored.lock().unwrap().push(Letter {
                reason: reason.to_owned(),
                attempts,
                message: message.clone(),
            });
            Ok(())
        })
    }
}

fn config() -> ConsumerConfig {
    ConsumerConfig {
        max_attempts: 10,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
        ..ConsumerConfig::new(NAME)
    }
}

/// Sweeps as a runner's sweeper does (`apply_due`, every 50 ms) until `done` holds; panics
/// after [`WAIT`].
async fn sweep_until<F, Fut>(
    what: &str,
    processor: &Processor,
    config: &ConsumerConfig,
    dead: &Letters,
    mut done: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until(what, WAIT, || {
        let done = done();
        async move {
            processor
                .apply_due(config, dead)
                .await
                .expect("a sweep reads what is due");
            done.await
        }
    })
    .await;
}

/// Version 2, then version 1, of order `x`: both held (version 1 behind version 2, due at
/// once).
async fn hold_2_then_1(processor: &Processor) {
    for version in [2, 1] {
        let outcome = processor
            .apply(&event("x", Some(version)).to_message())
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Held, "version {version}");
    }
}

async fn applied(db: &TestDb, aggregate: &str) -> Option<Vec<i64>> {
    Ledger::applied(db).await.remove(aggregate)
}

/// A held event whose handler's dependency is down for eleven tries (more than the tries
/// without an end after which a crashing event is dead-lettered) spends no attempt and counts
/// no crash: it is applied once the dependency is back, before the version held behind it.
#[tokio::test]
async fn a_held_event_whose_dependency_is_down_waits_the_outage_out_and_is_applied_in_order() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(
        Scripted::install(&db)
            .await
            .script("x", 1, &[Step::Outage; 11]),
    );
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, handler.clone())
        .with_version_gate(VersionGate::starting_at(1));
    let metrics = processor.metrics().clone();
    let dead = Letters::default();
    let config = config();
    hold_2_then_1(&processor).await;
    sweep_until(
        "both applied (or one dead-lettered)",
        &processor,
        &config,
        &dead,
        || async {
            applied(&db, "x").await.is_some_and(|v| v.len() == 2) || !dead.stored().is_empty()
        },
    )
    .await;
    assert!(
        dead.stored().is_empty(),
        "dead-lettered: {:?}",
        dead.stored()
    );
    assert_eq!(applied(&db, "x").await, Some(vec![1, 2]));
    assert_eq!(handler.calls("x", 1), 12, "11 outages, then applied");
    assert_eq!(metrics.count(NAME, Count::InfrastructureFailures), 11);
    assert_eq!(metrics.count(NAME, Count::Failures), 0);
    assert_eq!(held_rows(&db).await, 0);
}

/// A held event whose handler succeeds but whose transaction fails at its COMMIT (a deferred
/// unique constraint) has failed an attempt like any other: counted with its error, not tried
/// again before its backoff has passed, and dead-lettered after `max_attempts` with that error.
#[tokio::test]
async fn a_held_try_whose_commit_fails_is_a_failed_attempt_with_its_error() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(
        Scripted::install(&db)
            .await
            .script("x", 2, &[Step::FailAtCommit; 3]),
    );
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, handler.clone())
        .with_version_gate(VersionGate::starting_at(1));
    let metrics = processor.metrics().clone();
    let dead = Letters::default();
    // Backoffs of half an hour to an hour (equal jitter): no retry comes due by itself while
    // the test runs; the test lets each backoff pass by moving the retry to now.
    let config = ConsumerConfig {
        max_attempts: 3,
        initial_backoff: Duration::from_secs(3600),
        max_backoff: Duration::from_secs(3600),
        ..config()
    };
    let tools = ConsumerVersions::new(db.pool.clone(), &db.tables, NAME);
    let filter = Filter {
        limit: 10,
        ..Default::default()
    };
    let error = "database: error returned from database: \
                 duplicate key value violates unique constraint \"once_k\"";
    let backoff_ahead = db.tables.render(
        "SELECT bool_and(next_attempt_at > now() + interval '29 minutes') \
         FROM {schema}.consumer_held",
    );
    hold_2_then_1(&processor).await;
    for attempt in 1..=2 {
        sweep_until(
            &format!("try {attempt} of version 2 failed"),
            &processor,
            &config,
            &dead,
            || async { handler.calls("x", 2) == attempt },
        )
        .await;
        // Sweeps before its backoff has passed leave it alone.
        for _ in 0..3 {
            processor.apply_due(&config, &dead).await.unwrap();
        }
        assert_eq!(handler.calls("x", 2), attempt, "tried before its backoff");
        let held = tools.held(&filter).await.unwrap();
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(
            (
                held[0].version,
                held[0].attempts,
                held[0].tries,
                held[0].last_error.as_deref(),
                held[0].dead,
            ),
            (Some(2), attempt as i32, attempt as i32, Some(error), false),
            "{held:?}"
        );
        let reason = &held[0].reason;
        assert!(
            reason.starts_with(&format!(
                "attempt {attempt} of 3 failed; tried again after "
            )) && reason.ends_with(&format!(": {error}")),
            "{reason}"
        );
        assert!(
            sqlx::query_scalar::<_, bool>(&backoff_ahead)
                .fetch_one(&db.pool)
                .await
                .unwrap(),
            "tried again half an hour or more after the failure: {held:?}"
        );
        db.exec("UPDATE {schema}.consumer_held SET next_attempt_at = now()")
            .await;
    }
    sweep_until(
        "version 2 dead-lettered",
        &processor,
        &config,
        &dead,
        || async { !dead.stored().is_empty() },
    )
    .await;
    let stored = dead.stored();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(
        (stored[0].reason.as_str(), stored[0].attempts),
        (error, 3),
        "dead-lettered with its error after its attempts"
    );
    assert_eq!(
        stored[0].message.decode().unwrap().aggregate_version,
        Some(2)
    );
    assert_eq!(handler.calls("x", 2), 3);
    assert_eq!(applied(&db, "x").await, Some(vec![1]));
    assert_eq!(metrics.count(NAME, Count::Failures), 3);
    assert_eq!(metrics.count(NAME, Count::Handled), 1);
    assert_eq!(metrics.count(NAME, Count::DeadLettered), 1);
    assert_eq!(held_rows(&db).await, 0);
}

/// A drain on a pool of one connection that comes back late once a try is counted (a pool
/// that deliveries keep busy): the held events are applied in the sweep that counted their
/// tries, and no try is left counted. A drain that waited for the pool again after counting a
/// try would time out there, leave the try counted with nothing run, and after ten such sweeps
/// dead-letter the event as a crash, even without an attempt limit.
#[tokio::test]
async fn a_drain_waits_for_no_second_connection_once_its_try_is_counted() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(Scripted::install(&db).await);
    let unfinished = db
        .tables
        .render("SELECT count(*) FROM {schema}.consumer_held WHERE tries > attempts");
    // A released connection comes back at once, unless a try is counted and not finished:
    // then only when the test opens the pool.
    let open = CancellationToken::new();
    let hook = open.clone();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(500))
        .after_release(move |conn, _| {
            let unfinished = unfinished.clone();
            let open = hook.clone();
            Box::pin(async move {
                let tries: i64 = sqlx::query_scalar(&unfinished)
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap_or(0);
                if tries > 0 {
                    open.cancelled().await;
                }
                Ok(true)
            })
        })
        .connect(&db.url)
        .await
        .unwrap();
    let processor = Processor::new(pool.clone(), &db.tables, NAME, handler.clone())
        .with_version_gate(VersionGate::starting_at(1));
    let dead = Letters::default();
    let config = ConsumerConfig {
        max_attempts: u32::MAX,
        ..config()
    };
    hold_2_then_1(&processor).await;
    processor.apply_due(&config, &dead).await.unwrap();
    let after_one_sweep = applied(&db, "x").await;
    let tries: Vec<(i32, i32)> = sqlx::query_as(
        &db.tables
            .render("SELECT tries, attempts FROM {schema}.consumer_held ORDER BY id"),
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    open.cancel();
    assert_eq!(
        (after_one_sweep, tries),
        (Some(vec![1, 2]), vec![]),
        "applied in one sweep, no try left counted"
    );
    assert_eq!((handler.calls("x", 1), handler.calls("x", 2)), (1, 1));
    assert!(dead.stored().is_empty(), "{:?}", dead.stored());
    pool.close().await;
}

/// Kills its own backend (an idle-session killer, a pooler restart, a reset connection) on its
/// first `kills` calls, then does nothing.
struct Killer {
    calls: AtomicU32,
    kills: u32,
}

impl Handler for Killer {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        _event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            if self.calls.fetch_add(1, Ordering::SeqCst) < self.kills {
                sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
                    .execute(&mut *tx)
                    .await?;
            }
            Ok(())
        })
    }
}

/// A held event whose try loses its connection eleven times (the database up, one backend
/// killed each time) spends no attempt and counts no crash: each try is taken back on another
/// connection, and the event is applied, before the version held behind it, once the
/// connection holds.
#[tokio::test]
async fn a_try_whose_connection_dies_is_taken_back_not_counted_as_a_crash() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(Killer {
        calls: AtomicU32::new(0),
        kills: 11,
    });
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, handler.clone())
        .with_version_gate(VersionGate::starting_at(1));
    let dead = Letters::default();
    let config = ConsumerConfig {
        max_attempts: u32::MAX,
        ..config()
    };
    hold_2_then_1(&processor).await;
    wait_until("both applied (or one dead-lettered)", WAIT, || async {
        processor.apply_due(&config, &dead).await.unwrap();
        // An outage puts the event off a second: due again at once here.
        db.exec("UPDATE {schema}.consumer_held SET next_attempt_at = now()")
            .await;
        held_rows(&db).await == 0 || !dead.stored().is_empty()
    })
    .await;
    assert!(
        dead.stored().is_empty(),
        "dead-lettered: {:?}",
        dead.stored()
    );
    assert_eq!(
        handler.calls.load(Ordering::SeqCst),
        13,
        "11 killed, then v1, v2"
    );
}

/// A dead-letter destination that confirms only when the test lets it (a broker under a
/// memory alarm), and says when a store has begun.
#[derive(Default)]
struct Stalled {
    begun: AtomicU32,
    release: CancellationToken,
    stored: AtomicU32,
}

impl DeadLetters for Stalled {
    fn dead_letter<'a>(
        &'a self,
        _message: &'a Message,
        _reason: &'a str,
        _attempts: u32,
        _origin: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.begun.fetch_add(1, Ordering::SeqCst);
            tokio::select! {
                () = self.release.cancelled() => {}
                () = tokio::time::sleep(WAIT) => return Err("never released".into()),
            }
            self.stored.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }
}

/// While a drain waits for its dead-letter destination to confirm, it holds no connection:
/// on a pool of one, a delivery of another aggregate is applied meanwhile.
#[tokio::test]
async fn a_dead_letter_slow_to_confirm_holds_no_connection_from_other_aggregates() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(
        Scripted::install(&db)
            .await
            .script("x", 1, &[Step::Permanent]),
    );
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&db.url)
        .await
        .unwrap();
    let processor = Processor::new(pool.clone(), &db.tables, NAME, handler)
        .with_version_gate(VersionGate::starting_at(1));
    hold_2_then_1(&processor).await;
    let dead = Arc::new(Stalled::default());
    let sweep = {
        let (processor, dead) = (processor.clone(), dead.clone());
        tokio::spawn(async move { processor.apply_due(&config(), &*dead).await })
    };
    wait_until("the dead letter's store begun", WAIT, || async {
        dead.begun.load(Ordering::SeqCst) == 1
    })
    .await;
    let other = processor.apply(&event("y", Some(1)).to_message()).await;
    dead.release.cancel();
    sweep.await.unwrap().unwrap();
    assert_eq!(other.ok(), Some(Outcome::Applied), "y delivered meanwhile");
    assert_eq!(dead.stored.load(Ordering::SeqCst), 1);
    pool.close().await;
}

/// With a first-seen gate, version 1 (held behind version 2, which is settling) fails for good
/// and is dead-lettered: the aggregate then starts at version 1 and waits for its replay,
/// past the settle time, instead of starting at version 2 and refusing the replay.
#[tokio::test]
async fn a_first_seen_aggregate_whose_version_1_is_dead_lettered_waits_for_its_replay() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(Scripted::install(&db).await.script(
        "x",
        1,
        &[Step::Fail, Step::Fail, Step::Fail],
    ));
    let settle = Duration::from_millis(300);
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, handler)
        .with_version_gate(VersionGate::from_first_seen().settle(settle));
    let dead = Letters::default();
    let config = ConsumerConfig {
        max_attempts: 3,
        ..config()
    };
    hold_2_then_1(&processor).await;
    sweep_until(
        "version 1 dead-lettered",
        &processor,
        &config,
        &dead,
        || async { dead.stored().len() == 1 },
    )
    .await;
    // Sweeps go on until version 2 is older than the settle time, by the database's clock
    // (the one the gate reads), or is no longer held; then once more.
    let settled_sql = db.tables.render(&format!(
        "SELECT coalesce(bool_and(held_at + interval '{} milliseconds' <= now()), true) \
         FROM {{schema}}.consumer_held WHERE NOT dead",
        settle.as_millis()
    ));
    sweep_until("version 2 settled", &processor, &config, &dead, || async {
        sqlx::query_scalar::<_, bool>(&settled_sql)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    })
    .await;
    processor.apply_due(&config, &dead).await.unwrap();
    assert_eq!(
        applied(&db, "x").await,
        None,
        "nothing applied before version 1"
    );
    let tools = ConsumerVersions::new(db.pool.clone(), &db.tables, NAME);
    let filter = Filter {
        limit: 10,
        ..Default::default()
    };
    let held = tools.held(&filter).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (held[0].version, held[0].dead, held[0].next_attempt_at),
        (Some(2), false, None),
        "version 2 waits: {held:?}"
    );
    assert_eq!(held[0].reason, "waiting for version 1");
    let state = tools.list(&filter).await.unwrap();
    assert_eq!(
        (state[0].version, state[0].first_version),
        (None, Some(1)),
        "the aggregate starts at version 1: {state:?}"
    );

    // The operator replays version 1's dead letter (the handler is fixed now).
    let replay = dead.stored()[0].message.clone();
    assert_eq!(processor.apply(&replay).await.unwrap(), Outcome::Held);
    sweep_until("both applied", &processor, &config, &dead, || async {
        applied(&db, "x").await.is_some_and(|v| v.len() == 2)
    })
    .await;
    assert_eq!(applied(&db, "x").await, Some(vec![1, 2]));
    assert_eq!(held_rows(&db).await, 0);
    assert_eq!(dead.stored().len(), 1);
}

/// A given-up event whose dead letter is refused five times is stored on the sixth try with
/// the reason it was given up for, unchanged: failed stores do not grow the reason (nor the
/// `dead-letter-reason` header) while the dead-letter destination is down.
#[tokio::test]
async fn a_dead_letter_keeps_its_reason_however_often_its_store_is_refused() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(
        Scripted::install(&db)
            .await
            .script("x", 1, &[Step::Permanent]),
    );
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, handler)
        .with_version_gate(VersionGate::starting_at(1));
    let metrics = processor.metrics().clone();
    let dead = Letters::refusing(5);
    let config = config();
    hold_2_then_1(&processor).await;
    sweep_until(
        "the dead letter stored",
        &processor,
        &config,
        &dead,
        || async { dead.stored().len() == 1 },
    )
    .await;
    assert_eq!(dead.refused(), 5);
    let stored = dead.stored();
    assert_eq!(stored[0].reason, r#"("x", 1) is poison"#);
    assert_eq!(
        stored[0].message.decode().unwrap().aggregate_version,
        Some(1),
        "version 1 dead-lettered"
    );
    assert_eq!(metrics.count(NAME, Count::DeadLettered), 1);
    assert_eq!(applied(&db, "x").await, None);
    assert_eq!(
        held_rows(&db).await,
        1,
        "version 2 waits for version 1's replay"
    );
}

/// An event that comes before its turn with a NUL in a header value (Kafka and AMQP headers
/// are bytes) is held like any other and reaches the handler, in its turn, with the header
/// as it came.
#[tokio::test]
async fn an_early_event_with_a_nul_in_a_header_is_held_and_applied_with_it() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(Scripted::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, handler.clone())
        .with_version_gate(VersionGate::starting_at(1));
    let dead = Letters::default();
    let config = config();
    let mut early = event("x", Some(2));
    early
        .headers
        .insert("x-tenant".into(), "acme\u{0}eu".into());
    assert_eq!(
        processor.apply(&early.to_message()).await.unwrap(),
        Outcome::Held
    );
    assert_eq!(
        processor
            .apply(&event("x", Some(1)).to_message())
            .await
            .unwrap(),
        Outcome::Held
    );
    sweep_until("both applied", &processor, &config, &dead, || async {
        applied(&db, "x").await.is_some_and(|v| v.len() == 2)
    })
    .await;
    assert_eq!(applied(&db, "x").await, Some(vec![1, 2]));
    assert_eq!(
        handler.header("x", 2, "x-tenant").as_deref(),
        Some("acme\u{0}eu")
    );
    assert!(dead.stored().is_empty());
    assert_eq!(held_rows(&db).await, 0);
}

/// The same event in the relay's native envelope and as a binary CloudEvent (the relay's
/// envelope switched, and a row published again after a crash) is applied once: the second
/// is recognised by the inbox as a duplicate.
#[tokio::test]
async fn one_event_in_the_native_and_the_cloudevents_envelope_is_applied_once() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(Scripted::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, handler.clone())
        .with_version_gate(VersionGate::starting_at(1));
    let metrics = processor.metrics().clone();
    let id = Uuid::now_v7();
    // Native, as the relay publishes it with `envelope = "outbox"` (no aggregate version).
    let native: BTreeMap<String, String> = [
        ("event-id", id.to_string()),
        ("event-type", "OrderChanged".into()),
        ("aggregate-type", "order".into()),
        ("aggregate-id", "x".into()),
        ("content-type", "application/json".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    // The same row as a binary CloudEvent (`envelope = "cloudevents-binary"`, default source).
    let cloudevent: BTreeMap<String, String> =
        common::cloudevent_headers("ce-", &id.to_string(), "/outbox/order", "x", None)
            .into_iter()
            .collect();
    let mut outcomes = Vec::new();
    for headers in [native, cloudevent] {
        let message = Message::new("order.OrderChanged", headers, Bytes::from_static(b"{}"));
        outcomes.push(processor.apply(&message).await.unwrap());
    }
    assert_eq!(outcomes, vec![Outcome::Applied, Outcome::Duplicate]);
    assert_eq!(handler.calls("x", -1), 1);
    assert_eq!(Ledger::count(&db).await, 1);
    assert_eq!(metrics.count(NAME, Count::Duplicates), 1);
    assert_eq!(held_rows(&db).await, 0);
}

/// An aggregate version of `i64::MAX` (any producer may send it; no version can follow it) is
/// refused as undecodable, holding nothing; the version below it is held by a first-seen gate,
/// settles and is applied by the drain.
#[tokio::test]
async fn an_aggregate_version_of_i64_max_is_refused_and_the_one_below_it_is_applied() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(Scripted::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, handler.clone())
        .with_version_gate(VersionGate::from_first_seen().settle(Duration::from_millis(100)));
    let dead = Letters::default();
    let config = config();
    let refused = processor
        .apply(&event("x", Some(i64::MAX)).to_message())
        .await
        .unwrap_err();
    assert!(refused.is_permanent(), "{refused:?}");
    assert!(
        refused.message().contains("aggregate-version"),
        "{refused:?}"
    );
    assert_eq!(held_rows(&db).await, 0);
    assert_eq!(handler.calls("x", i64::MAX), 0);

    let below = i64::MAX - 1;
    assert_eq!(
        processor
            .apply(&event("x", Some(below)).to_message())
            .await
            .unwrap(),
        Outcome::Held,
        "first seen: settling"
    );
    sweep_until(
        "the version settled and applied",
        &processor,
        &config,
        &dead,
        || async { applied(&db, "x").await.is_some() },
    )
    .await;
    processor.apply_due(&config, &dead).await.unwrap();
    assert_eq!(applied(&db, "x").await, Some(vec![below]));
    assert_eq!(handler.calls("x", below), 1);
    assert_eq!(held_rows(&db).await, 0);
    let state = ConsumerVersions::new(db.pool.clone(), &db.tables, NAME)
        .list(&Filter {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(state.len(), 1, "{state:?}");
    assert_eq!(state[0].version, Some(below));
}

/// `consumer-versions seed --from-held` where one held aggregate's lowest version is
/// `i64::MIN` (a first-seen gate holds it; no version comes before it to start from) is
/// refused as a whole, with an error that names that aggregate: nothing is seeded or audited,
/// and the other aggregate can then be seeded on its own.
#[tokio::test]
async fn seeding_from_held_refuses_a_lowest_version_of_i64_min_by_name() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(Scripted::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, handler)
        .with_version_gate(VersionGate::from_first_seen());
    for (aggregate, version) in [("a", i64::MIN), ("b", 5)] {
        assert_eq!(
            processor
                .apply(&event(aggregate, Some(version)).to_message())
                .await
                .unwrap(),
            Outcome::Held,
            "{aggregate} version {version}: settling"
        );
    }
    let tools = ConsumerVersions::new(db.pool.clone(), &db.tables, NAME);
    let everything = Filter {
        limit: 100,
        ..Default::default()
    };
    let refused = tools
        .seed(&everything, &Seed::LowestHeld, false, "ops", "joined late")
        .await
        .unwrap_err();
    assert!(
        matches!(refused, versions::Error::Refused(_)),
        "{refused:?}"
    );
    assert_eq!(
        refused.to_string(),
        "order \"a\": its lowest held version is -9223372036854775808: \
         no version before it to start from"
    );
    let seeds_sql = db
        .tables
        .render("SELECT count(*) FROM {schema}.audit WHERE action = 'consumer_seed'");
    let seeds = || async {
        sqlx::query_scalar::<_, i64>(&seeds_sql)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    assert_eq!(seeds().await, 0, "nothing audited");
    let mut state: Vec<(String, Option<i64>, bool, i32)> = tools
        .list(&everything)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.aggregate_id, a.version, a.seeded, a.held))
        .collect();
    state.sort();
    assert_eq!(
        state,
        vec![("a".into(), None, false, 1), ("b".into(), None, false, 1)],
        "nothing seeded"
    );
    assert_eq!(held_rows(&db).await, 2);

    // The operator seeds the other aggregate by name.
    let b = Filter {
        aggregate_id: Some("b".into()),
        ..everything
    };
    assert_eq!(
        tools
            .seed(&b, &Seed::LowestHeld, false, "ops", "joined late")
            .await
            .unwrap(),
        vec![Change {
            aggregate_type: "order".into(),
            aggregate_id: "b".into(),
            from: None,
            to: 4,
        }]
    );
    assert_eq!(seeds().await, 1);
}

/// `consumer-versions seed --from-held --aggregate-id z --limit 2` seeds `z` though two other
/// held aggregates sort before it: the limit counts the aggregates that match, not those
/// read before the id is looked at.
#[tokio::test]
async fn seeding_from_held_one_aggregate_is_not_cut_by_the_limit() {
    let db = TestDb::new(1).await;
    let handler = Arc::new(Scripted::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, handler)
        .with_version_gate(VersionGate::from_first_seen());
    for aggregate in ["a", "b", "z"] {
        assert_eq!(
            processor
                .apply(&event(aggregate, Some(5)).to_message())
                .await
                .unwrap(),
            Outcome::Held,
            "{aggregate}: settling"
        );
    }
    let tools = ConsumerVersions::new(db.pool.clone(), &db.tables, NAME);
    let z = Filter {
        aggregate_id: Some("z".into()),
        limit: 2,
        ..Default::default()
    };
    assert_eq!(
        tools
            .seed(&z, &Seed::LowestHeld, false, "ops", "joined late")
            .await
            .unwrap(),
        vec![Change {
            aggregate_type: "order".into(),
            aggregate_id: "z".into(),
            from: None,
            to: 4,
        }]
    );
}

/// An operator seeds a new aggregate (`consumer-versions seed --version 4`) while a runner's
/// first hold of it (version 5) is not committed yet: the seed waits for that hold and makes
/// version 5 due, so the sweep applies it and version 6 follows at once.
///
/// The runner's transaction is paused before its commit by an AFTER INSERT trigger waiting on
/// an advisory lock the test holds.
#[tokio::test]
async fn a_seed_racing_the_first_hold_of_an_aggregate_makes_the_held_event_due() {
    let db = TestDb::new(1).await;
    let ledger = Arc::new(Ledger::install(&db).await);
    let processor = Processor::new(db.pool.clone(), &db.tables, NAME, ledger)
        .with_version_gate(VersionGate::starting_at(1));
    let key: i64 = 700_000 + i64::from(rand::random::<u32>() % 100_000);
    db.exec(&format!(
        "CREATE FUNCTION {{schema}}.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             -- A failing test still holding the lock must not stall its runner for ever.
             PERFORM set_config('lock_timeout', '60s', true);
             PERFORM pg_advisory_xact_lock_shared({key});
             RETURN NULL;
         END $$;
         CREATE TRIGGER slow_commit AFTER INSERT ON {{schema}}.consumer_versions
         FOR EACH ROW EXECUTE FUNCTION {{schema}}.slow_commit();"
    ))
    .await;
    let mut gate = db.pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut *gate)
        .await
        .unwrap();
    // The runner holds version 5 (its transaction pauses before its commit).
    let v5 = event("o", Some(5)).to_message();
    let runner = {
        let processor = processor.clone();
        tokio::spawn(async move { processor.apply(&v5).await })
    };
    let waiting = |sql: String| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(&sql)
                .bind(key)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    wait_until("the runner waits before its commit", WAIT, || {
        waiting(
            "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND objid = $1::bigint::oid"
                .to_owned(),
        )
    })
    .await;
    // The operator seeds the aggregate meanwhile.
    let filter = Filter {
        aggregate_type: Some("order".into()),
        aggregate_id: Some("o".into()),
        held_only: false,
        limit: 10,
    };
    let seed = {
        let tools = ConsumerVersions::new(db.pool.clone(), &db.tables, NAME);
        let filter = filter.clone();
        tokio::spawn(async move {
            tools
                .seed(
                    &filter,
                    &Seed::Version(4),
                    false,
                    "ops",
                    "consumer deployed late",
                )
                .await
        })
    };
    // A statement on this test's version state waits for the runner's transaction.
    wait_until("the seed waits on the runner's hold", WAIT, || {
        waiting(db.tables.render(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event = 'transactionid' \
             AND query LIKE '%{schema}.consumer_versions%' AND $1 > 0",
        ))
    })
    .await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut *gate)
        .await
        .unwrap();
    drop(gate);
    assert_eq!(runner.await.unwrap().unwrap(), Outcome::Held);
    assert_eq!(
        seed.await.unwrap().unwrap(),
        vec![Change {
            aggregate_type: "order".into(),
            aggregate_id: "o".into(),
            from: None,
            to: 4,
        }]
    );
    let dead = Letters::default();
    let config = ConsumerConfig::new(NAME);
    sweep_until("version 5 applied", &processor, &config, &dead, || async {
        applied(&db, "o").await.is_some()
    })
    .await;
    assert_eq!(
        processor
            .apply(&event("o", Some(6)).to_message())
            .await
            .unwrap(),
        Outcome::Applied
    );
    assert_eq!(applied(&db, "o").await, Some(vec![5, 6]));
    assert_eq!(held_rows(&db).await, 0);
    assert!(dead.stored().is_empty(), "{:?}", dead.stored());
}
