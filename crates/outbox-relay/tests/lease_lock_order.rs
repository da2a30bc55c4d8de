//! The lease rows are locked in partition order by every statement that locks several of them,
//! on PostgreSQL: a mark (its fence, FOR SHARE) and a renewal (FOR UPDATE) that lock in
//! different orders deadlock, and the deadlock detector answers only after `deadlock_timeout`
//! (1 s): the bench saw deliveries stall for a second.

use std::{str::FromStr, time::Duration};

use outbox::Event;
use outbox_relay::store::{Marking, PgStore};
use outbox_testkit::{wait_until, TestDb};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    Connection, PgConnection,
};

/// A session whose plans walk the batch's partitions in the order given (a nested loop over
/// them, the lease rows by index), as PostgreSQL may plan it on a table of another size: a
/// statement that locks in its plan's order then locks in the relay's order.
fn nested_loops(url: &str) -> PgConnectOptions {
    PgConnectOptions::from_str(url).unwrap().options([
        ("enable_hashjoin", "off"),
        ("enable_mergejoin", "off"),
        ("enable_seqscan", "off"),
        ("enable_sort", "off"),
    ])
}

#[tokio::test]
async fn a_mark_waiting_on_one_lease_holds_no_later_one() {
    let db = TestDb::new(8).await;
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox()
        .enqueue(&mut tx, &Event::new("order", "a", "Placed"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let id: i64 = sqlx::query_scalar(&db.tables.render("SELECT id FROM {schema}.{events}"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let store = PgStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let mut fences = store
        .acquire("r1", 8, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(fences.len(), 8);
    // A batch's fences in the order the relay rotates them: not partition order.
    fences.sort_by_key(|f| std::cmp::Reverse(f.0));

    // Another transaction holds the lowest partition's lease row (a takeover, say). A
    // connection of its own: closing it ends the transaction if the test fails.
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let mut other = conn.begin().await.unwrap();
    sqlx::query(
        &db.tables
            .render("SELECT 1 FROM {schema}.leases WHERE partition = 0 FOR UPDATE"),
    )
    .execute(&mut *other)
    .await
    .unwrap();

    // The mark, from a pool whose session can be told apart, waits for that row.
    let app = format!("lock-order-{}", db.schema);
    let options = nested_loops(&db.url).application_name(&app);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let marker = PgStore::open(pool, &db.tables).await.unwrap();
    let mark_fences = fences.clone();
    let mark = tokio::spawn(async move {
        marker
            .mark_published("r1", &mark_fences, &[id], Marking::Claimed)
            .await
    });
    wait_until(
        "the mark to wait on the lease row",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                 WHERE application_name = $1 AND wait_event_type = 'Lock')",
            )
            .bind(&app)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        },
    )
    .await;

    // A renewal of the other partitions is not held up by the waiting mark: it locked none of
    // them before the lowest. Before, the mark held the leases it met first, and a renewal
    // of them waited for it (with a renewal holding the lowest, a deadlock).
    let rest: Vec<_> = fences.iter().copied().filter(|f| f.0 != 0).collect();
    let renew = tokio::spawn({
        let store = PgStore::open(db.pool.clone(), &db.tables).await.unwrap();
        async move { store.renew("r1", &rest, Duration::from_secs(60)).await }
    });
    wait_until(
        "the renewal to pass the waiting mark",
        Duration::from_secs(10),
        || async { renew.is_finished() },
    )
    .await;
    assert_eq!(renew.await.unwrap().unwrap().len(), 7);
    other.commit().await.unwrap();
    assert_eq!(
        mark.await.unwrap().unwrap(),
        vec![id],
        "the mark goes on once the row is free"
    );
}

#[tokio::test]
async fn a_renewal_waiting_on_one_lease_holds_no_later_one() {
    let db = TestDb::new(8).await;
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox()
        .enqueue(&mut tx, &Event::new("order", "a", "Placed"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let id: i64 = sqlx::query_scalar(&db.tables.render("SELECT id FROM {schema}.{events}"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let store = PgStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let mut fences = store
        .acquire("r1", 8, Duration::from_secs(60))
        .await
        .unwrap();
    fences.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let mut other = conn.begin().await.unwrap();
    sqlx::query(
        &db.tables
            .render("SELECT 1 FROM {schema}.leases WHERE partition = 0 FOR UPDATE"),
    )
    .execute(&mut *other)
    .await
    .unwrap();
    let app = format!("lock-order-renew-{}", db.schema);
    let options = nested_loops(&db.url).application_name(&app);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let renewer = PgStore::open(pool, &db.tables).await.unwrap();
    let renew_fences = fences.clone();
    let renew = tokio::spawn(async move {
        renewer
            .renew("r1", &renew_fences, Duration::from_secs(60))
            .await
    });
    wait_until(
        "the renewal to wait on the lease row",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                 WHERE application_name = $1 AND wait_event_type = 'Lock')",
            )
            .bind(&app)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        },
    )
    .await;
    // A mark under the other partitions is not held up by the waiting renewal.
    let rest: Vec<_> = fences.iter().copied().filter(|f| f.0 != 0).collect();
    let mark = tokio::spawn({
        let store = PgStore::open(db.pool.clone(), &db.tables).await.unwrap();
        async move {
            store
                .mark_published("r1", &rest, &[id], Marking::Claimed)
                .await
        }
    });
    wait_until(
        "the mark to pass the waiting renewal",
        Duration::from_secs(10),
        || async { mark.is_finished() },
    )
    .await;
    mark.await.unwrap().unwrap();
    other.commit().await.unwrap();
    assert_eq!(renew.await.unwrap().unwrap().len(), 8);
}
