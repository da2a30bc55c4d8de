//! The version gate on real PostgreSQL, through the processor alone (as a program that applies
//! messages itself would use it): whatever order deliveries come in, each aggregate's events
//! apply once and in version order; a version that overtakes its predecessor is held in the
//! database and applied by `apply_due` once its turn comes.

mod common;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use common::{assert_in_order, held_rows, Ledger};
use futures::future::BoxFuture;
use outbox_consumer::{
    ConsumerConfig, Count, DeadLetters, Envelope, Handler, HandlerError, Message, Outcome,
    Processor, VersionGate,
};
use outbox_testkit::{wait_until, TestDb};
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};
use sqlx::PgConnection;
use uuid::Uuid;

fn event(aggregate: &str, version: i64) -> Envelope {
    let event_id = Uuid::now_v7();
    Envelope {
        event_id,
        message_id: event_id.to_string(),
        event_type: "OrderChanged".into(),
        schema_version: 1,
        aggregate_type: Some("order".into()),
        aggregate_id: Some(aggregate.into()),
        aggregate_version: Some(version),
        occurred_at: None,
        copy_of_schema_version: None,
        destination: "order.OrderChanged".into(),
        headers: BTreeMap::new(),
        payload: Bytes::from_static(b"{}"),
    }
}

async fn gated(db: &TestDb, gate: VersionGate) -> Processor {
    let ledger = Arc::new(Ledger::install(db).await);
    Processor::new(db.pool.clone(), &db.tables, "ledger", ledger).with_version_gate(gate)
}

/// Dead letters kept in memory: (reason, message).
#[derive(Default)]
struct Letters(Mutex<Vec<(String, Message)>>);

impl DeadLetters for Letters {
    fn dead_letter<'a>(
        &'a self,
        message: &'a Message,
        reason: &'a str,
        _attempts: u32,
        _origin: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.0
                .lock()
                .unwrap()
                .push((reason.to_owned(), message.clone()));
            Ok(())
        })
    }
}

/// Applies whatever is due until nothing is.
async fn apply_due(processor: &Processor, dead: &Letters) {
    let config = ConsumerConfig::new("ledger");
    while processor.apply_due(&config, dead).await.unwrap() {}
}

/// Before (no gate): deliveries applied in the order they came, so a shuffled redelivery
/// applied version 3 before version 1.
#[tokio::test]
async fn shuffled_and_duplicated_deliveries_apply_once_in_version_order() {
    let db = TestDb::new(1).await;
    let processor = gated(&db, VersionGate::starting_at(1)).await;
    let dead = Letters::default();
    let mut rng = StdRng::seed_from_u64(21);
    let aggregates: Vec<(String, i64)> = (0..6).map(|n| (format!("o{n}"), 1 + n % 4 * 2)).collect();
    // Every event delivered twice, everything shuffled.
    let mut deliveries: Vec<Envelope> = Vec::new();
    for (id, last) in &aggregates {
        for version in 1..=*last {
            let e = event(id, version);
            deliveries.push(e.clone());
            deliveries.push(e);
        }
    }
    deliveries.shuffle(&mut rng);
    let (mut applied, mut duplicates, mut held) = (0, 0, 0);
    for delivery in &deliveries {
        match processor.apply(&delivery.to_message()).await.unwrap() {
            Outcome::Applied => applied += 1,
            Outcome::Duplicate => duplicates += 1,
            Outcome::Held => held += 1,
            other => panic!("{other:?}"),
        }
        if rng.random_bool(0.3) {
            apply_due(&processor, &dead).await;
        }
    }
    apply_due(&processor, &dead).await;
    let total: i64 = aggregates.iter().map(|(_, last)| last).sum();
    assert!(held > 0, "the shuffle made some versions wait");
    assert_eq!(applied + held + duplicates, 2 * total);
    let metrics = processor.metrics();
    assert_eq!(metrics.count("ledger", Count::Handled), total as u64);
    assert_eq!(metrics.count("ledger", Count::Held), held as u64);
    assert_eq!(metrics.count("ledger", Count::Failures), 0);
    assert!(dead.0.lock().unwrap().is_empty());
    assert_eq!(held_rows(&db).await, 0);
    assert_in_order(&Ledger::applied(&db).await, &aggregates);
}

#[tokio::test]
async fn a_missing_version_holds_its_successors_and_only_them() {
    let db = TestDb::new(1).await;
    let processor = gated(&db, VersionGate::starting_at(1)).await;
    let dead = Letters::default();
    let v1 = event("gap", 1);
    let v2 = event("gap", 2);
    assert_eq!(
        processor.apply(&v2.to_message()).await.unwrap(),
        Outcome::Held
    );
    apply_due(&processor, &dead).await;
    assert_eq!(held_rows(&db).await, 1, "version 2 waits for version 1");
    // Another aggregate flows meanwhile; events without a version pass the gate.
    assert_eq!(
        processor
            .apply(&event("other", 1).to_message())
            .await
            .unwrap(),
        Outcome::Applied
    );
    let mut unversioned = event("other", 0);
    unversioned.aggregate_version = None;
    assert_eq!(
        processor.apply(&unversioned.to_message()).await.unwrap(),
        Outcome::Applied
    );
    // The predecessor arrives (held behind nothing but due at once); both then apply.
    assert_eq!(
        processor.apply(&v1.to_message()).await.unwrap(),
        Outcome::Held
    );
    apply_due(&processor, &dead).await;
    let applied = Ledger::applied(&db).await;
    assert_eq!(applied["gap"], [1, 2]);
    assert_eq!(held_rows(&db).await, 0);
    // Version 0 is below where this gate starts: permanent, named.
    let err = processor
        .apply(&event("zero", 0).to_message())
        .await
        .unwrap_err();
    assert!(err.is_permanent());
    assert!(
        err.to_string().contains("below the first version 1"),
        "{err}"
    );
}

/// Before: the first version seen became the start at once, so a version 1 that came after
/// version 2 (a failed first attempt, another topic) was acknowledged as a duplicate and never
/// applied.
#[tokio::test]
async fn from_first_seen_waits_for_earlier_versions_then_starts_at_the_lowest() {
    let db = TestDb::new(1).await;
    let processor = gated(
        &db,
        VersionGate::from_first_seen().settle(Duration::from_millis(300)),
    )
    .await;
    let dead = Letters::default();
    // Reordered: version 2 first, version 1 within the settle time.
    assert_eq!(
        processor
            .apply(&event("reordered", 2).to_message())
            .await
            .unwrap(),
        Outcome::Held
    );
    assert_eq!(
        processor
            .apply(&event("reordered", 1).to_message())
            .await
            .unwrap(),
        Outcome::Held
    );
    apply_due(&processor, &dead).await;
    assert_eq!(Ledger::applied(&db).await["reordered"], [1, 2]);
    // A consumer that joins late: version 7 is the lowest it ever sees.
    for version in [7, 8] {
        assert_eq!(
            processor
                .apply(&event("late", version).to_message())
                .await
                .unwrap(),
            Outcome::Held
        );
    }
    apply_due(&processor, &dead).await;
    assert!(!Ledger::applied(&db).await.contains_key("late"), "settling");
    wait_until("late started at 7", Duration::from_secs(30), || async {
        apply_due(&processor, &dead).await;
        Ledger::applied(&db).await.get("late") == Some(&vec![7, 8])
    })
    .await;
    assert_eq!(
        processor
            .apply(&event("late", 10).to_message())
            .await
            .unwrap(),
        Outcome::Held
    );
    assert_eq!(
        processor
            .apply(&event("late", 8).to_message())
            .await
            .unwrap(),
        Outcome::Duplicate,
        "a new event id with an applied version is skipped"
    );
    // Below the start: never applied, never acknowledged as a duplicate: dead-lettered.
    let err = processor
        .apply(&event("late", 5).to_message())
        .await
        .unwrap_err();
    assert!(err.is_permanent(), "{err}");
    assert!(
        err.to_string()
            .contains("started the aggregate at version 7"),
        "{err}"
    );
    assert_eq!(Ledger::applied(&db).await["late"], [7, 8]);
}

/// The ledger, failing once the first time each of `failing`'s (aggregate, version) comes.
struct FailingOnce {
    ledger: Ledger,
    failing: Mutex<Vec<(String, i64)>>,
}

impl Handler for FailingOnce {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        let key = (
            event.aggregate_id.clone().unwrap_or_default(),
            event.aggregate_version.unwrap_or_default(),
        );
        let fail = {
            let mut failing = self.failing.lock().unwrap();
            let found = failing.iter().position(|k| *k == key);
            found.map(|at| failing.remove(at)).is_some()
        };
        if fail {
            return Box::pin(async move { Err(HandlerError::new(format!("{key:?} fails once"))) });
        }
        self.ledger.handle(tx, event)
    }
}

/// The aggregate's last version applied, as its state row says (`None`: no row).
async fn version_of(db: &TestDb, aggregate: &str) -> Option<Option<i64>> {
    sqlx::query_scalar(&db.tables.render(
        "SELECT version FROM {schema}.consumer_versions WHERE consumer = 'ledger' \
         AND aggregate_type = 'order' AND aggregate_id = $1",
    ))
    .bind(aggregate)
    .fetch_optional(&db.pool)
    .await
    .unwrap()
}

/// A handler that fails leaves no trace of its event: for an aggregate's first event (no state
/// row yet) and for a later one, the version stays where it was, the inbox forgets the event,
/// and its next delivery applies it.
#[tokio::test]
async fn a_failed_handler_leaves_the_version_where_it_was() {
    let db = TestDb::new(1).await;
    let handler = FailingOnce {
        ledger: Ledger::install(&db).await,
        failing: Mutex::new(vec![("a".into(), 1), ("a".into(), 3)]),
    };
    let processor = Processor::new(db.pool.clone(), &db.tables, "ledger", Arc::new(handler))
        .with_version_gate(VersionGate::starting_at(1));
    let events: Vec<Envelope> = (1..=3).map(|v| event("a", v)).collect();
    let first = processor.apply(&events[0].to_message()).await;
    assert!(first.is_err(), "v1 failed: {first:?}");
    assert_eq!(
        version_of(&db, "a").await,
        None,
        "no state row after v1 failed"
    );
    assert_eq!(
        processor.apply(&events[0].to_message()).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        processor.apply(&events[1].to_message()).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(version_of(&db, "a").await, Some(Some(2)));
    let third = processor.apply(&events[2].to_message()).await;
    assert!(third.is_err(), "v3 failed: {third:?}");
    assert_eq!(version_of(&db, "a").await, Some(Some(2)), "v3 undone");
    assert_eq!(
        processor.apply(&events[2].to_message()).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        processor.apply(&events[2].to_message()).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(version_of(&db, "a").await, Some(Some(3)));
    assert_eq!(held_rows(&db).await, 0);
    assert_in_order(&Ledger::applied(&db).await, &[("a".into(), 3)]);
}

/// The ledger, misbehaving the first time each event comes: it runs `sql` on the consumer's
/// transaction and ignores what happens (a failed statement without a savepoint aborts the
/// transaction; `ROLLBACK` ends it).
struct MisbehavesOnce {
    ledger: Ledger,
    sql: &'static str,
    seen: Mutex<Vec<Uuid>>,
}

impl MisbehavesOnce {
    fn new(db: &TestDb, sql: &'static str) -> Self {
        Self {
            ledger: Ledger::on(db),
            sql,
            seen: Mutex::new(Vec::new()),
        }
    }
}

impl Handler for MisbehavesOnce {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        let first = {
            let mut seen = self.seen.lock().unwrap();
            let first = !seen.contains(&event.event_id);
            seen.push(event.event_id);
            first
        };
        Box::pin(async move {
            self.ledger.handle(&mut *tx, event).await?;
            if first {
                let _ = sqlx::query(self.sql).execute(&mut *tx).await;
            }
            Ok(())
        })
    }
}

/// A handler that returns `Ok` after ignoring a failed statement leaves its transaction
/// aborted, and PostgreSQL answers COMMIT with a silent rollback; one that runs `ROLLBACK`
/// itself leaves the statements after it running in transactions of their own. Either way the
/// delivery must fail, not count as applied (its message would be acknowledged with nothing
/// applied, or its version recorded without its effect), with a gate or without one; and its
/// next delivery applies it once. Before, an event without a gate was reported applied after an
/// ignored error, and any event after a `ROLLBACK`.
#[tokio::test]
async fn a_handler_that_breaks_its_transaction_fails_its_delivery() {
    let db = TestDb::new(1).await;
    Ledger::install(&db).await;
    for (sql, expected) in [
        ("SELECT 1 / 0", "current transaction is aborted"),
        ("ROLLBACK", "the handler ended the consumer's transaction"),
    ] {
        for gated in [false, true] {
            let name = format!("{}-{}", if gated { "gated" } else { "ungated" }, sql.len());
            let handler = MisbehavesOnce::new(&db, sql);
            let mut processor = Processor::new(
                db.pool.clone(),
                &db.tables,
                name.as_str(),
                Arc::new(handler),
            );
            if gated {
                processor = processor.with_version_gate(VersionGate::starting_at(1));
            }
            let event = event(&name, 1);
            let failed = processor.apply(&event.to_message()).await;
            let error = failed.expect_err(&name);
            assert!(error.message().contains(expected), "{name}: {error}");
            assert!(!error.is_infrastructure(), "{name}: an attempt of its own");
            assert_eq!(
                processor.metrics().count(&name, Count::Handled),
                0,
                "{name}"
            );
            assert_eq!(
                version_of_consumer(&db, &name).await,
                None,
                "{name}: no version"
            );
            assert_eq!(
                processor.apply(&event.to_message()).await.unwrap(),
                Outcome::Applied,
                "{name}: its next delivery applies it"
            );
            assert_eq!(
                Ledger::applied(&db).await.get(&name),
                Some(&vec![1]),
                "{name}: applied once"
            );
        }
    }
}

/// The same for a held event, applied by the drain: a handler that ends the transaction fails
/// the try (held for its next attempt), writes nothing of the gate's, and the next try applies
/// the event once, in order.
#[tokio::test]
async fn a_held_event_whose_handler_ends_its_transaction_is_tried_again() {
    let db = TestDb::new(1).await;
    Ledger::install(&db).await;
    let handler = MisbehavesOnce::new(&db, "ROLLBACK");
    let processor = Processor::new(db.pool.clone(), &db.tables, "ledger", Arc::new(handler))
        .with_version_gate(VersionGate::starting_at(1));
    let dead = Letters::default();
    let (v1, v2) = (event("h", 1), event("h", 2));
    assert_eq!(
        processor.apply(&v2.to_message()).await.unwrap(),
        Outcome::Held
    );
    // Behind v2 held, v1 is held too; the drain applies both in order.
    assert_eq!(
        processor.apply(&v1.to_message()).await.unwrap(),
        Outcome::Held
    );
    let config = ConsumerConfig {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        ..ConsumerConfig::new("ledger")
    };
    // v1's first try ends its transaction: nothing of the gate's is written.
    processor.apply_due(&config, &dead).await.unwrap();
    assert_eq!(version_of(&db, "h").await, Some(None), "v1 not recorded");
    assert_eq!(Ledger::count(&db).await, 0);
    // Its next try applies it; v2's first try fails the same way, then v2 is applied.
    wait_until("v1 and v2 applied", Duration::from_secs(10), || async {
        processor.apply_due(&config, &dead).await.unwrap();
        version_of(&db, "h").await == Some(Some(2))
    })
    .await;
    assert_eq!(processor.metrics().count("ledger", Count::Handled), 2);
    assert_eq!(processor.metrics().count("ledger", Count::Failures), 2);
    assert!(dead.0.lock().unwrap().is_empty());
    assert_eq!(held_rows(&db).await, 0);
    assert_in_order(&Ledger::applied(&db).await, &[("h".into(), 2)]);
}

/// Consumer `consumer`'s last version of order `consumer` (each case of the test above is a
/// consumer with an aggregate of its name).
async fn version_of_consumer(db: &TestDb, consumer: &str) -> Option<Option<i64>> {
    sqlx::query_scalar(&db.tables.render(
        "SELECT version FROM {schema}.consumer_versions WHERE consumer = $1 \
         AND aggregate_type = 'order' AND aggregate_id = $1",
    ))
    .bind(consumer)
    .fetch_optional(&db.pool)
    .await
    .unwrap()
}

/// A handler that runs `COMMIT` itself has committed the event's work (its effect and inbox row)
/// by the time it returns: the event is counted applied, its version recorded after it, and a
/// redelivery is a duplicate, with a gate or without one, and for a held event applied by the
/// drain. Nothing is applied twice, and no aggregate waits for a version it applied.
#[tokio::test]
async fn a_handler_that_commits_itself_applies_its_event_once() {
    let db = TestDb::new(1).await;
    Ledger::install(&db).await;
    for gated in [false, true] {
        let name = if gated { "gated" } else { "ungated" };
        let handler = MisbehavesOnce::new(&db, "COMMIT");
        let mut processor = Processor::new(db.pool.clone(), &db.tables, name, Arc::new(handler));
        if gated {
            processor = processor.with_version_gate(VersionGate::starting_at(1));
        }
        let event = event(name, 1);
        for expected in [Outcome::Applied, Outcome::Duplicate] {
            assert_eq!(
                processor.apply(&event.to_message()).await.unwrap(),
                expected,
                "{name}"
            );
        }
        let version = version_of_consumer(&db, name).await;
        assert_eq!(version, gated.then_some(Some(1)), "{name}");
        assert_eq!(
            Ledger::applied(&db).await.get(name),
            Some(&vec![1]),
            "{name}"
        );
    }
    let handler = MisbehavesOnce::new(&db, "COMMIT");
    let processor = Processor::new(db.pool.clone(), &db.tables, "ledger", Arc::new(handler))
        .with_version_gate(VersionGate::starting_at(1));
    let dead = Letters::default();
    for v in [2, 1] {
        assert_eq!(
            processor.apply(&event("h", v).to_message()).await.unwrap(),
            Outcome::Held
        );
    }
    apply_due(&processor, &dead).await;
    assert_eq!(version_of(&db, "h").await, Some(Some(2)));
    assert_eq!(processor.metrics().count("ledger", Count::Handled), 2);
    assert!(dead.0.lock().unwrap().is_empty());
    assert_eq!(held_rows(&db).await, 0);
    assert_eq!(Ledger::applied(&db).await.get("h"), Some(&vec![1, 2]));
}
