//! SQLite storage (sqlx): the embedded default. The same contract as PostgreSQL's, in tables
//! named `{schema}_events`, `{schema}_inbox`, … (SQLite has no schemas). One relay at a time.

mod inbox;
mod migrate;
mod writer;

pub use inbox::SqliteInbox;
pub use migrate::MIGRATIONS;
pub use writer::SqliteOutbox;
