//! An operator's replay racing a relay that dead-letters an event of the same aggregate, on
//! PostgreSQL: the park the relay commits while the replay runs stays.

use outbox::{Event, Outbox};
use outbox_relayer::admin::Admin;
use outbox_testkit::{wait_until, TestDb};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    Connection, PgConnection,
};
use std::{str::FromStr, time::Duration};

#[tokio::test]
async fn a_park_committed_while_a_replay_runs_stays() {
    let db = TestDb::new(1).await;
    let mut tx = db.pool.begin().await.unwrap();
    let events: Vec<Event> = (1..=3)
        .map(|v| Event::new("order", "a", "Happened").aggregate_version(v))
        .collect();
    db.outbox().enqueue_batch(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    let ids: Vec<i64> = sqlx::query_scalar(
        &db.tables
            .render("SELECT id FROM {schema}.{events} ORDER BY id"),
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    // The first is dead and was skipped (no hold).
    sqlx::query(
        &db.tables
            .render("UPDATE {schema}.{events} SET status = 'dead' WHERE id = $1"),
    )
    .bind(ids[0])
    .execute(&db.pool)
    .await
    .unwrap();

    // A relay dead-letters the second and parks the aggregate, in a transaction still open
    // when the replay of the first starts (what mark_failed.sql writes).
    // A connection of its own: if the test fails, closing it ends the transaction (a pooled
    // one would keep it open and its locks would hold the schema's drop back).
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let mut relay = conn.begin().await.unwrap();
    sqlx::query(
        &db.tables
            .render("UPDATE {schema}.{events} SET status = 'dead' WHERE id = $1"),
    )
    .bind(ids[1])
    .execute(&mut *relay)
    .await
    .unwrap();
    sqlx::query(&db.tables.render(
        "INSERT INTO {schema}.holds (aggregate_type, aggregate_id, partition, event_id, \
         held_until) SELECT aggregate_type, aggregate_id, partition, id, NULL \
         FROM {schema}.{events} WHERE id = $1",
    ))
    .bind(ids[1])
    .execute(&mut *relay)
    .await
    .unwrap();

    // The operator's pool, named so that its session can be told apart.
    let app = format!("replay-race-{}", db.schema);
    let options = PgConnectOptions::from_str(&db.url)
        .unwrap()
        .application_name(&app);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let admin = Admin::new(pool, &db.tables);
    let first = ids[0];
    let replay = tokio::spawn(async move { admin.replay(&[first], "test", "race").await });
    wait_until(
        "the replay to wait on the relay's hold",
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
    relay.commit().await.unwrap();
    // Its snapshot saw no park: the first is replayed (it precedes the second).
    assert_eq!(replay.await.unwrap().unwrap(), 1);
    let hold: (i64, bool) = sqlx::query_as(
        &db.tables
            .render("SELECT event_id, held_until IS NULL FROM {schema}.holds"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        hold,
        (ids[1], true),
        "the aggregate stays parked on the second"
    );
}
