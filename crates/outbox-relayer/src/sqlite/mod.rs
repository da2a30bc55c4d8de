//! The relay on SQLite, the embedded default: its store, its operator actions and the doctor's
//! reads, with their SQL in `sql/store.sql`, `sql/admin.sql` and `sql/doctor.sql`. One relay
//! publishes at a time.

mod admin;
mod doctor;
mod store;

pub use store::SqliteStore;
