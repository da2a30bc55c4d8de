//! The session every outbox connection runs with on MySQL and MariaDB, whatever the server's
//! defaults are: the relay, the operator commands and the purges must never take locks an
//! application insert waits on, never read uncommitted rows, and never wait longer than a
//! lease lasts.

use std::time::Duration;

use sqlx::{mysql::MySqlPoolOptions, Connection, Executor, MySqlConnection, MySqlPool};

/// How long a connection's statements may wait for a lock, and run, on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Session {
    /// `innodb_lock_wait_timeout`, in whole seconds rounded down (at least 1): a statement
    /// blocked behind another session's row lock fails after it, rather than after the
    /// server's 50 s.
    pub lock_wait: Duration,
    /// `max_statement_time` on MariaDB, `max_execution_time` on MySQL (which bounds `SELECT`s
    /// only): a statement running away fails after it.
    pub statement: Duration,
}

impl Default for Session {
    /// The relay's defaults: 5 s for a lock, 30 s for a statement.
    fn default() -> Self {
        Self {
            lock_wait: Duration::from_secs(5),
            statement: Duration::from_secs(30),
        }
    }
}

impl Session {
    /// The statements that set the session, for a server whose `VERSION()` is `version`:
    ///
    /// - `READ COMMITTED`: reads take no gap or next-key locks (under the server's default
    ///   REPEATABLE READ, a locking read of the last published rows locks the gap every new
    ///   pending row goes into, and every application insert waits), locks on rows a statement
    ///   does not change are let go at once, and an `UPDATE` skips a row another transaction
    ///   is still inserting rather than waiting for it. A server set to READ UNCOMMITTED would
    ///   let the claim publish rows that are rolled back later.
    /// - `autocommit = 1`: a server whose `init_connect` turns it off would keep every pooled
    ///   connection in one long transaction, its snapshot frozen.
    /// - the lock wait and statement timeouts above;
    /// - `time_zone = '+00:00'`: `NOW()` and the like are UTC, as the tables' times are;
    /// - on MariaDB, `in_predicate_conversion_threshold = 0`: a list of 1,000 ids or more
    ///   (a claim of 1,024 rows) is kept as an index lookup, not turned into a join over a
    ///   derived table.
    pub fn statements(&self, version: &str) -> Vec<String> {
        // Whole seconds, rounded down (the wait stays under the lease), at least 1.
        let lock_wait = self.lock_wait.as_secs().max(1);
        let mut set = vec![
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_owned(),
            "SET SESSION autocommit = 1".to_owned(),
            format!("SET SESSION innodb_lock_wait_timeout = {lock_wait}"),
            "SET SESSION time_zone = '+00:00'".to_owned(),
        ];
        if is_mariadb(version) {
            set.push(format!(
                "SET SESSION max_statement_time = {:.3}",
                self.statement.as_secs_f64().max(0.001)
            ));
            set.push("SET SESSION in_predicate_conversion_threshold = 0".to_owned());
        } else {
            set.push(format!(
                "SET SESSION max_execution_time = {}",
                self.statement.as_millis().clamp(1, u128::from(u32::MAX))
            ));
        }
        set
    }

    /// Sets this session on `conn`. On a server that logs statements to its binary log
    /// (`binlog_format = STATEMENT`), InnoDB refuses every write under READ COMMITTED (error
    /// 1665): the session logs rows instead, which needs the `BINLOG ADMIN` privilege
    /// (MariaDB) or `SYSTEM_VARIABLES_ADMIN` (MySQL); without it, the error says so.
    pub async fn set(&self, conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
        let (version, log_bin, format): (String, i64, String) = sqlx::query_as(
            "SELECT VERSION(), CAST(@@log_bin AS SIGNED), CAST(@@binlog_format AS CHAR)",
        )
        .fetch_one(&mut *conn)
        .await?;
        for statement in self.statements(&version) {
            conn.execute(sqlx::raw_sql(&statement)).await?;
        }
        if log_bin != 0 && format.eq_ignore_ascii_case("STATEMENT") {
            conn.execute(sqlx::raw_sql("SET SESSION binlog_format = 'ROW'"))
                .await
                .map_err(|e| {
                    sqlx::Error::Configuration(
                        format!(
                            "the server logs statements (binlog_format = STATEMENT), which \
                             InnoDB refuses under READ COMMITTED, and this user may not set \
                             its session to ROW ({e}): set binlog_format to ROW or MIXED on \
                             the server, or grant the outbox's user BINLOG ADMIN (MariaDB) or \
                             SYSTEM_VARIABLES_ADMIN (MySQL)"
                        )
                        .into(),
                    )
                })?;
        }
        Ok(())
    }

    /// A pool like `pool` (its connect options, size and acquire timeout; lazily connected)
    /// whose every connection is set to this session when it opens. A connection handed back
    /// inside a transaction (a task dropped mid-way) is closed rather than reused.
    pub fn pool(&self, pool: &MySqlPool) -> MySqlPool {
        self.pool_of(pool, pool.options().get_max_connections())
    }

    /// [`Session::pool`] with at most `max` connections.
    pub fn pool_of(&self, pool: &MySqlPool, max: u32) -> MySqlPool {
        let session = *self;
        MySqlPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(pool.options().get_acquire_timeout())
            .after_connect(move |conn, _| Box::pin(async move { session.set(conn).await }))
            .after_release(|conn, _| Box::pin(async move { Ok(!conn.is_in_transaction()) }))
            .connect_lazy_with((*pool.connect_options()).clone())
    }
}

/// Whether a server's `VERSION()` is MariaDB's (`10.11.6-MariaDB-0+deb12u1`).
pub fn is_mariadb(version: &str) -> bool {
    version.to_ascii_lowercase().contains("mariadb")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_server_gets_the_timeouts_it_knows() {
        let session = Session {
            lock_wait: Duration::from_millis(2500),
            statement: Duration::from_secs(30),
        };
        let maria = session.statements("10.11.6-MariaDB-0+deb12u1");
        assert!(maria.contains(&"SET SESSION innodb_lock_wait_timeout = 2".to_owned()));
        assert!(maria.contains(&"SET SESSION max_statement_time = 30.000".to_owned()));
        assert!(!maria.iter().any(|s| s.contains("max_execution_time")));
        let mysql = session.statements("8.0.36");
        assert!(mysql.contains(&"SET SESSION max_execution_time = 30000".to_owned()));
        assert!(!mysql.iter().any(|s| s.contains("in_predicate")));
        let tiny = Session {
            lock_wait: Duration::from_millis(1),
            statement: Duration::ZERO,
        };
        assert!(tiny
            .statements("8.0")
            .contains(&"SET SESSION innodb_lock_wait_timeout = 1".to_owned()));
    }
}
