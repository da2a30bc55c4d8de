//! The version gate on real PostgreSQL: whatever order deliveries come in, each aggregate's
//! events apply once and in version order; a version that overtakes its predecessor waits.

mod common;

use std::{collections::BTreeMap, sync::Arc};

use bytes::Bytes;
use common::{assert_in_order, Ledger};
use outbox_consumer::{Count, Envelope, Outcome, Processor, VersionGate};
use outbox_testkit::TestDb;
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};
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

/// Before (no gate): deliveries applied in the order they came, so a shuffled redelivery
/// applied version 3 before version 1.
#[tokio::test]
async fn shuffled_and_duplicated_deliveries_apply_once_in_version_order() {
    let db = TestDb::new(1).await;
    let processor = gated(&db, VersionGate::starting_at(&db.tables, 1)).await;
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
    // A broker redelivering what was not acknowledged, in any order, until nothing is left.
    while let Some(delivery) = deliveries.pop() {
        match processor.apply(&delivery).await {
            Ok(Outcome::Applied) => applied += 1,
            Ok(Outcome::Duplicate) => duplicates += 1,
            Ok(Outcome::CopySkipped) => unreachable!("no copies here"),
            Err(e) if e.is_out_of_order() => {
                held += 1;
                let at = rng.random_range(0..=deliveries.len());
                deliveries.insert(at, delivery);
            }
            Err(e) => panic!("{e}"),
        }
    }
    let total: i64 = aggregates.iter().map(|(_, last)| last).sum();
    assert_eq!((applied, duplicates), (total, total));
    assert!(held > 0, "the shuffle made some versions wait");
    let metrics = processor.metrics();
    assert_eq!(metrics.count("ledger", Count::OutOfOrder), held);
    assert_eq!(metrics.count("ledger", Count::Failures), 0);
    assert_in_order(&Ledger::applied(&db).await, &aggregates);
}

#[tokio::test]
async fn a_missing_version_holds_its_successors_and_only_them() {
    let db = TestDb::new(1).await;
    let processor = gated(&db, VersionGate::starting_at(&db.tables, 1)).await;
    let v1 = event("gap", 1);
    let v2 = event("gap", 2);
    let err = processor.apply(&v2).await.unwrap_err();
    assert!(err.is_out_of_order(), "{err}");
    assert!(!err.counts_as_attempt());
    assert_eq!(
        err.to_string(),
        "order \"gap\" version 2 arrived before version 1: held until it is applied"
    );
    // Another aggregate flows meanwhile; events without a version pass the gate.
    assert_eq!(
        processor.apply(&event("other", 1)).await.unwrap(),
        Outcome::Applied
    );
    let mut unversioned = event("other", 0);
    unversioned.aggregate_version = None;
    assert_eq!(
        processor.apply(&unversioned).await.unwrap(),
        Outcome::Applied
    );
    // The predecessor arrives; the held one then applies.
    assert_eq!(processor.apply(&v1).await.unwrap(), Outcome::Applied);
    assert_eq!(processor.apply(&v2).await.unwrap(), Outcome::Applied);
    let applied = Ledger::applied(&db).await;
    assert_eq!(applied["gap"], [1, 2]);
    // Version 0 is below where this gate starts: a failure of the message, named.
    let err = processor.apply(&event("zero", 0)).await.unwrap_err();
    assert!(err.counts_as_attempt());
    assert!(
        err.to_string().contains("below the first version 1"),
        "{err}"
    );
}

#[tokio::test]
async fn from_first_seen_starts_where_the_consumer_joins() {
    let db = TestDb::new(1).await;
    let processor = gated(&db, VersionGate::from_first_seen(&db.tables)).await;
    for version in [7, 8] {
        assert_eq!(
            processor.apply(&event("late", version)).await.unwrap(),
            Outcome::Applied
        );
    }
    assert!(processor
        .apply(&event("late", 10))
        .await
        .unwrap_err()
        .is_out_of_order());
    assert_eq!(
        processor.apply(&event("late", 8)).await.unwrap(),
        Outcome::Duplicate,
        "a new event id with an applied version is skipped"
    );
    assert_eq!(Ledger::applied(&db).await["late"], [7, 8]);
}
