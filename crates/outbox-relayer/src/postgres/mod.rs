//! The relay on PostgreSQL, the first and fullest backend: its store (claims, marks, leases,
//! statistics), its operator actions, the CDC source's statements and replication stream, the
//! doctor's reads, and the SQL of them all in `sql/`.

mod admin;
mod cdc;
mod doctor;
mod rows;
mod store;

pub use cdc::PgCdc;
pub use store::{PgStore, Timeouts};
