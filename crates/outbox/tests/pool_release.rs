//! `outbox::postgres::outside_transaction`: a connection released inside a transaction sqlx
//! does not know of (as a task aborted during `BEGIN` leaves it) is closed, not pooled.

use outbox::postgres::outside_transaction;
use outbox_testkit::database_url;
use sqlx::postgres::PgPoolOptions;

#[tokio::test]
async fn a_connection_released_inside_a_transaction_is_closed_and_its_locks_go() {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .after_release(|conn, _| Box::pin(outside_transaction(conn)))
        .connect(&database_url())
        .await
        .unwrap();
    // A plain statement: the connection goes back to the pool and comes out again.
    let mut conn = pool.acquire().await.unwrap();
    let first = backend(&mut conn).await.unwrap();
    drop(conn);
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(backend(&mut conn).await.unwrap(), first, "pooled");

    // A transaction begun behind sqlx's back, holding a lock: the connection is closed.
    let key = rand_key();
    sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(key)
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    let mut conn = pool.acquire().await.unwrap();
    assert_ne!(backend(&mut conn).await.unwrap(), first, "a new connection");
    let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(key)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(
        free,
        "the lock went with the closed connection's transaction"
    );
}

async fn backend(conn: &mut sqlx::PgConnection) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
}

/// An advisory lock key of this test process's own.
fn rand_key() -> i64 {
    i64::from(std::process::id()) << 20 | 0x5eed
}
