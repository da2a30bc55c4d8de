//! The relay on PostgreSQL, the first and fullest backend: its store (claims, marks, leases,
//! statistics), its operator actions, the CDC source's statements and replication stream, and
//! the SQL of all three in `sql/`.

mod admin;
mod cdc;
mod rows;
mod store;

pub use cdc::PgCdc;
pub use store::{PgStore, Timeouts};
