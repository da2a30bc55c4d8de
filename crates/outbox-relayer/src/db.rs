//! What every database statement of the relay goes through, whichever backend runs it: a bound
//! on how long the answer may take, and a transaction that commits or rolls back with its result.

use std::time::Duration;

/// `answer`, or a timeout error once `limit` has passed without one: a connection that hangs
/// without an error (a network black hole) must not hang the relay with it.
pub(crate) async fn within<T>(
    limit: Duration,
    answer: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout(limit, answer)
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer from the database within {limit:?}"),
            )))
        })
}

/// Commits `tx` when `result` is Ok, else rolls it back; returns `result`.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) async fn finish<DB: sqlx::Database, T>(
    tx: sqlx::Transaction<'static, DB>,
    result: Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    match result {
        Ok(value) => tx.commit().await.map(|()| value),
        Err(error) => {
            let _ = tx.rollback().await;
            Err(error)
        }
    }
}
