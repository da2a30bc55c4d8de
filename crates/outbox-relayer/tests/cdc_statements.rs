//! The CDC statements that change shared state (`hold`, `unpark`, the end of catch-up,
//! `terminate`) against a real PostgreSQL with `wal_level = logical`: a streamer whose lease
//! was taken over (a paused process that wakes up) changes nothing through them, while the
//! lease's holder can; and the end of a catch-up leaves a newer catch-up record be.

mod common;

use common::cdc::{cdc_db, write, WAIT};
use outbox::postgres::{cdc::CdcNames, WriteMode};
use outbox_relayer::{
    cdc::{heartbeat_prefix, CdcDb, ReplicationEvent, ReplicationTarget, StreamPosition},
    postgres::PgCdc,
};
use outbox_testkit::{wait_until, TestDb};

/// The successor, holding partition 0 at epoch 2; the former streamer held it at epoch 1.
const HOLDER: (&str, &[(i32, i64)]) = ("successor", &[(0, 2)]);
const FORMER: (&str, &[(i32, i64)]) = ("former", &[(0, 1)]);

/// An outbox of one partition whose lease the successor took over from the former streamer,
/// with one row of `sick/a0`, dead-lettered and parked; the CDC statements on it.
async fn set_up() -> (TestDb, PgCdc, i64) {
    let db = cdc_db(1).await;
    let s = &db.schema;
    sqlx::query(&format!(
        "UPDATE {s}.leases SET owner = 'successor', epoch = 2, \
         expires_at = now() + interval '1 hour' WHERE partition = 0"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    write(&db, WriteMode::Table, "sick", 1, 1, 1).await;
    let id: i64 = sqlx::query_scalar(
        &db.tables
            .render("UPDATE {schema}.{events} SET status = 'dead' RETURNING id"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {s}.holds (aggregate_type, aggregate_id, partition, event_id, held_until) \
         VALUES ('sick', 'a0', 0, $1, NULL)"
    ))
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    let target = ReplicationTarget::from_url(&db.url).unwrap();
    let cdc = PgCdc::new(db.pool.clone(), &db.tables, target);
    (db, cdc, id)
}

async fn holds(db: &TestDb) -> Vec<(String, Option<f64>)> {
    sqlx::query_as(&format!(
        "SELECT aggregate_id, EXTRACT(epoch FROM held_until - now())::double precision \
         FROM {}.holds ORDER BY aggregate_id",
        db.schema
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_former_streamer_cannot_release_or_replace_its_successors_park() {
    let (db, cdc, id) = set_up().await;
    let key = ("sick", "a0");
    // Nothing of sick/a0 is pending: `unpark` would release it, but not for the former streamer.
    let (held, _) = cdc.unpark(FORMER.0, FORMER.1, key).await.unwrap();
    assert!(!held, "the former streamer's leases are gone");
    assert_eq!(
        holds(&db).await,
        [("a0".to_owned(), None)],
        "the park stays"
    );
    // Nor can it turn the park into a retry (which would publish past the dead event).
    let position = StreamPosition::default();
    let held = cdc
        .hold(FORMER.0, FORMER.1, key, id, Some(0.0), position, true)
        .await
        .unwrap();
    assert!(!held);
    assert_eq!(holds(&db).await, [("a0".to_owned(), None)], "still parked");
    // Nor hold an aggregate of its own.
    let other = ("well", "1");
    let held = cdc
        .hold(FORMER.0, FORMER.1, other, id, None, position, false)
        .await
        .unwrap();
    assert!(!held);
    assert_eq!(holds(&db).await.len(), 1, "no hold written");
    // The holder can: the statements are not inert.
    let (held, free) = cdc.unpark(HOLDER.0, HOLDER.1, key).await.unwrap();
    assert!(held && free);
    assert!(holds(&db).await.is_empty(), "the holder released it");
}

#[tokio::test]
async fn a_former_streamer_cannot_end_the_catch_up_or_the_successors_stream() {
    let (db, cdc, _) = set_up().await;
    let names = CdcNames::for_tables(&db.tables);
    let (slot, publication) = (names.slot.as_str(), names.publication.as_str());
    let s = &db.schema;
    let catch_up = || async {
        sqlx::query_scalar::<_, Option<i64>>(&format!(
            "SELECT catch_up_max_id FROM {s}.cdc_slots WHERE slot = $1"
        ))
        .bind(slot)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    sqlx::query(&format!(
        "UPDATE {s}.cdc_slots SET catch_up_max_id = 7 WHERE slot = $1"
    ))
    .bind(slot)
    .execute(&db.pool)
    .await
    .unwrap();
    assert!(!cdc
        .catch_up_done(FORMER.0, FORMER.1, slot, 7)
        .await
        .unwrap());
    assert_eq!(catch_up().await, Some(7), "catch-up is still to be done");
    assert!(cdc
        .catch_up_done(HOLDER.0, HOLDER.1, slot, 7)
        .await
        .unwrap());
    assert_eq!(catch_up().await, None);

    // The successor streams the slot; the former streamer's `terminate` leaves its stream be.
    let mut stream = cdc
        .replicate(slot, publication, "successor")
        .await
        .expect("replication stream");
    let active = || async {
        sqlx::query_scalar::<_, Option<i32>>(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(slot)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    wait_until("the stream to hold the slot", WAIT, || async {
        active().await.is_some()
    })
    .await;
    let streamer = active().await;
    assert!(!cdc.terminate(FORMER.0, FORMER.1, slot).await.unwrap());
    // The stream still carries what is written after that statement: a message of this
    // outbox's own prefix (a terminated walsender would have ended the stream first).
    let prefix = heartbeat_prefix(&db.tables);
    cdc.heartbeat(&prefix).await.unwrap();
    loop {
        match tokio::time::timeout(WAIT, stream.recv()).await {
            Ok(Ok(Some(ReplicationEvent::Message { prefix: p, .. }))) if p == prefix => break,
            Ok(Ok(Some(_))) => {}
            other => panic!("the successor's stream ended: {other:?}"),
        }
    }
    assert_eq!(active().await, streamer, "the same walsender streams");
    // The holder's ends it.
    assert!(cdc.terminate(HOLDER.0, HOLDER.1, slot).await.unwrap());
    wait_until("the stream to be ended", WAIT, || async {
        active().await.is_none()
    })
    .await;
    stream.abort();
}

#[tokio::test]
async fn the_end_of_a_catch_up_leaves_a_newer_record_to_catch_up() {
    let (db, cdc, _) = set_up().await;
    let slot = CdcNames::for_tables(&db.tables).slot;
    let record = |max: Option<i64>| {
        let (db, slot) = (&db, slot.as_str());
        async move {
            sqlx::query_scalar::<_, Option<i64>>(&db.tables.render(
                "UPDATE {schema}.cdc_slots SET catch_up_max_id = coalesce($2, catch_up_max_id) \
                 WHERE slot = $1 RETURNING catch_up_max_id",
            ))
            .bind(slot)
            .bind(max)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        }
    };
    // A relay caught up to 7 while the slot was lost and made again (`outbox migrate --cdc`
    // recorded 300: the rows written meanwhile).
    record(Some(300)).await;
    assert!(cdc
        .catch_up_done(HOLDER.0, HOLDER.1, slot.as_str(), 7)
        .await
        .unwrap());
    assert_eq!(
        record(None).await,
        Some(300),
        "rows up to 300 still to catch up"
    );
    assert!(cdc
        .catch_up_done(HOLDER.0, HOLDER.1, slot.as_str(), 300)
        .await
        .unwrap());
    assert_eq!(record(None).await, None);
}
