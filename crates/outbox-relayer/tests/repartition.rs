//! The procedure `docs/operations.md` gives for changing the partition count, run exactly as
//! written (its SQL block read from the page): afterwards the outbox has the indexes a new
//! outbox with that many partitions has, and the relay drains the backlog in order.

mod common;

use std::{collections::BTreeSet, time::Duration};

use outbox_testkit::{insert_sequences, unique, NatsReader, Report, TestDb, NATS_URL};

const WAIT: Duration = Duration::from_secs(60);

/// The SQL block of the section "Changing the partition count", for the outbox in `schema`.
fn procedure(schema: &str) -> String {
    let page = include_str!("../../../docs/operations.md");
    let section = page
        .split("## Changing the partition count")
        .nth(1)
        .expect("the section is in docs/operations.md");
    let block = section
        .split("```sql\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section has an SQL block");
    block.replace("outbox.", &format!("{schema}."))
}

/// The outbox's indexes on its events table: name and definition, the schema written `S`.
async fn indexes(db: &TestDb) -> BTreeSet<(String, String)> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = $1 \
         AND tablename = 'events'",
    )
    .bind(&db.schema)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(name, def)| (name, def.replace(&db.schema, "S")))
        .collect()
}

#[tokio::test]
async fn the_documented_repartition_leaves_a_fresh_outboxs_indexes_and_drains_in_order() {
    let db = TestDb::new(4).await;
    let written = insert_sequences(&db, "order", 40, 5, 25).await;

    sqlx::raw_sql(&procedure(&db.schema))
        .execute(&db.pool)
        .await
        .expect("the documented procedure runs");

    let fresh = TestDb::new(64).await;
    assert_eq!(
        indexes(&db).await,
        indexes(&fresh).await,
        "the indexes of a new outbox with 64 partitions"
    );
    let (partitions, leases, max, spread, misplaced_holds): (i32, i64, i32, i64, i64) =
        sqlx::query_as(&db.tables.render(
            "SELECT (SELECT partitions FROM {schema}.meta), \
                    (SELECT count(*) FROM {schema}.leases), \
                    (SELECT max(partition) FROM {schema}.{events}), \
                    (SELECT count(DISTINCT partition) FROM {schema}.{events}), \
                    (SELECT count(*) FROM {schema}.holds h JOIN {schema}.{events} e \
                       ON e.id = h.event_id WHERE h.partition <> e.partition)",
        ))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!((partitions, leases), (64, 64));
    assert!(
        max < 64 && spread > 4,
        "rows spread over 64: max {max}, {spread} used"
    );
    assert_eq!(misplaced_holds, 0);

    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("REPART"), &prefix).await;
    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    let got = reader.wait_for(written, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    let report = Report::of(&got);
    assert_eq!(report.unique, written);
    assert_eq!(report.order_violations, 0, "{report:?}");
    reader.cleanup().await;
}
