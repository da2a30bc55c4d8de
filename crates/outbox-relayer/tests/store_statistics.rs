//! The relay keeps the outbox table's planner statistics fresh, even without autovacuum.

use outbox_relayer::postgres::PgStore;
use outbox_testkit::TestDb;

#[tokio::test]
async fn statistics_are_refreshed_after_a_large_backlog_arrives_and_not_again_at_once() {
    let db = TestDb::new(4).await;
    let store = PgStore::open(db.pool.clone(), &db.tables).await.unwrap();
    assert!(
        !store.refresh_statistics().await.unwrap(),
        "nothing changed yet"
    );
    db.exec(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, payload)
         SELECT gen_random_uuid(), 'order', (i % 100)::text, 'Placed', '\\x7b7d'::bytea
         FROM generate_series(1, 20000) i",
    )
    .await;
    // The cumulative statistics lag the inserts by up to a second: retry until they show.
    outbox_testkit::wait_until(
        "an ANALYZE once the inserts are counted",
        std::time::Duration::from_secs(30),
        || async { store.refresh_statistics().await.unwrap() },
    )
    .await;
    let last: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT last_analyze FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'events'",
    )
    .bind(&db.schema)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(last.is_some());
    assert!(
        !store.refresh_statistics().await.unwrap(),
        "fresh statistics are kept"
    );
}
