//! A pool guard against connections released inside a transaction.
//!
//! sqlx (0.8) counts a transaction only once its `BEGIN` has answered: a future dropped in
//! between (an aborted task, a `tokio::time::timeout`, a `select!`) leaves the transaction
//! open on the server without sqlx knowing (sqlx issue 4393), and the pool hands the
//! connection to its next user, whose statements then run inside it and hold its locks for
//! good. [`outside_transaction`] asks the server instead, for `PgPoolOptions::after_release`:
//!
//! ```no_run
//! # async fn pool(url: &str) -> Result<sqlx::PgPool, sqlx::Error> {
//! sqlx::postgres::PgPoolOptions::new()
//!     .after_release(|conn, _| Box::pin(outbox::postgres::outside_transaction(conn)))
//!     .connect(url)
//!     .await
//! # }
//! ```
//!
//! It costs one round trip per release; pools whose futures are never cancelled do not need it.

/// Whether a connection going back to the pool is outside any transaction, by the server's
/// word (the statement starts its own transaction). A connection inside one, or that cannot
/// answer, is to be closed (the server rolls the transaction back) rather than pooled.
pub async fn outside_transaction(conn: &mut sqlx::PgConnection) -> Result<bool, sqlx::Error> {
    use sqlx::{Connection, Executor, Row};
    if conn.is_in_transaction() {
        return Ok(false);
    }
    // A query without arguments goes as one simple-protocol message: outside a transaction it
    // starts its own, at its own start.
    let fresh = conn
        .fetch_one("SELECT statement_timestamp() = transaction_timestamp()")
        .await
        .and_then(|row| row.try_get::<bool, _>(0));
    Ok(fresh.unwrap_or(false))
}
