//! The relay on MySQL 8 and MariaDB 10.6+: its store, its operator actions and the doctor's
//! reads, with their SQL in `sql/store.sql`, `sql/admin.sql` and `sql/doctor.sql` (see
//! `docs/storage/mysql.md`).

mod admin;
mod doctor;
mod store;

pub use store::{MySqlStore, DATETIME_OF_MS, NOW_MS};
