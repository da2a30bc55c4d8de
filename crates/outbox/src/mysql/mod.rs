//! MySQL 8 / MariaDB 10.6+ storage (sqlx). The same contract as PostgreSQL's, in tables named
//! `{schema}_events`, `{schema}_inbox`, … in the connection's database (a MySQL schema is a
//! database; the prefix keeps several outboxes apart in one). Partitions and leases as on
//! PostgreSQL: any number of relays share the work.

mod inbox;
mod migrate;
mod session;
mod writer;

pub use inbox::MySqlInbox;
pub use migrate::{DEFAULT_PARTITIONS, MIGRATIONS};
pub use session::{is_mariadb, Session};
pub use writer::MySqlOutbox;

/// The server's error number (1205: lock wait timeout, 1062: duplicate key, …), when `error`
/// comes from MySQL or MariaDB.
pub fn error_number(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()?
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number())
}
