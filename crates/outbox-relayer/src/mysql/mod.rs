//! The relay on MySQL 8 and MariaDB 10.6+: its store and its operator actions, with their SQL
//! in `sql/store.sql` and `sql/admin.sql` (see `docs/storage/mysql.md`).

mod admin;
mod store;

pub use store::{MySqlStore, DATETIME_OF_MS, NOW_MS};
