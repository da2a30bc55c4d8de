//! The relay on MySQL 8 and MariaDB 10.6+: its store, its operator actions, the doctor's and
//! the verifier's reads, with their SQL in `sql/store.sql`, `sql/admin.sql`, `sql/doctor.sql`
//! and `sql/verify.sql` (see `docs/storage/mysql.md`).

mod admin;
mod doctor;
mod store;
mod verify;

pub use store::{MySqlStore, DATETIME_OF_MS, NOW_MS};
