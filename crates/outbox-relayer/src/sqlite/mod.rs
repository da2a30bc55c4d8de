//! The relay on SQLite, the embedded default: its store, its operator actions, the doctor's and
//! the verifier's reads, with their SQL in `sql/store.sql`, `sql/admin.sql`, `sql/doctor.sql`
//! and `sql/verify.sql`. One relay publishes at a time.

mod admin;
mod doctor;
mod store;
mod verify;

pub use store::SqliteStore;
