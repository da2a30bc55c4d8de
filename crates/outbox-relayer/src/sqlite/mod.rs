//! The relay on SQLite, the embedded default: its store and its operator actions, with their
//! SQL in `sql/store.sql` and `sql/admin.sql`. One relay publishes at a time.

mod admin;
mod store;

pub use store::SqliteStore;
