//! PostgreSQL storage (sqlx): the writer ([`PgOutbox`]), the inbox ([`PgInbox`]), the schema
//! migrations, CDC set-up and time partitions. Statements live in `sql/`, one file per part.

pub mod cdc;
mod inbox;
mod migrate;
mod release;
pub mod time_partitions;
mod writer;

pub use crate::inbox::Seen;
pub use crate::migration::{MigrateOptions, DEFAULT_PARTITIONS};
pub use inbox::PgInbox;
pub use migrate::MIGRATIONS;
pub use release::outside_transaction;
pub use writer::{PgOutbox, WriteMode};
