//! The relay on PostgreSQL, the first and fullest backend: its store (claims, marks, leases,
//! statistics), its operator actions, the CDC source's statements and replication stream, the
//! doctor's and the verifier's reads, and the SQL of them all in `sql/`.

mod admin;
mod cdc;
mod doctor;
mod doctor_cdc;
mod rows;
mod store;
mod verify;

pub use cdc::PgCdc;
pub use doctor_cdc::cdc_checks;
pub use store::{PgStore, Timeouts};
