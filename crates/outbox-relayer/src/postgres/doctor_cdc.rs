//! The change-data-capture checks of `outbox doctor` (`--mode cdc`): `wal_level`, the
//! REPLICATION attribute, the publication and the slot, the slot's lag and retained WAL, and
//! `max_slot_wal_keep_size`.

use outbox::{sql::named, Tables};
use sqlx::PgPool;

use crate::{config::CdcConfig, doctor::Check};

const AREA: &str = "cdc";

fn sql(name: &str) -> &'static str {
    named(include_str!("sql/doctor.sql"), name)
}

/// The checks of a CDC relay with settings `cdc` on the outbox `tables` of `pool`.
pub async fn cdc_checks(pool: &PgPool, tables: &Tables, cdc: &CdcConfig) -> Vec<Check> {
    let mut checks = Vec::new();
    let settings: Result<(String, String, bool), sqlx::Error> =
        sqlx::query_as(sql("cdc_settings")).fetch_one(pool).await;
    let (wal_level, keep_size, replication) = match settings {
        Ok(settings) => settings,
        Err(error) => {
            checks.push(Check::fail(
                AREA,
                "settings",
                format!("cannot be read: {error}"),
                "run doctor as the relay's user",
            ));
            return checks;
        }
    };
    checks.push(if wal_level == "logical" {
        Check::ok(AREA, "wal_level", "logical")
    } else {
        Check::fail(
            AREA,
            "wal_level",
            format!("'{wal_level}': logical replication needs 'logical'"),
            "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
        )
    });
    let user: String = sqlx::query_scalar(sql("current_user"))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|_| "<relay user>".into());
    checks.push(if replication {
        Check::ok(
            AREA,
            "REPLICATION",
            format!("user {user} may stream changes"),
        )
    } else {
        Check::fail(
            AREA,
            "REPLICATION",
            format!(
                "user {user} lacks the REPLICATION attribute: it cannot open a replication stream"
            ),
            format!("ALTER ROLE \"{user}\" REPLICATION;"),
        )
    });
    checks.push(if keep_size == "-1" {
        Check::warn(
            AREA,
            "max_slot_wal_keep_size",
            "unlimited: a slot no relay reads retains WAL until the disk is full",
            format!(
                "set max_slot_wal_keep_size above cdc.max_retained_wal_bytes ({} bytes), and \
                 alert on outbox_cdc_retained_wal_alarm",
                cdc.max_retained_wal_bytes
            ),
        )
    } else {
        Check::ok(AREA, "max_slot_wal_keep_size", keep_size.clone())
    });
    let names = match outbox::postgres::cdc::CdcNames::resolve(
        pool,
        tables,
        cdc.slot.as_deref(),
        cdc.publication.as_deref(),
    )
    .await
    {
        Ok(names) => names,
        Err(error) => {
            checks.push(Check::fail(
                AREA,
                "names",
                error.to_string(),
                "correct [relay.cdc] slot / publication",
            ));
            return checks;
        }
    };
    let (slot, publication) = (names.slot.as_str(), names.publication.as_str());
    let published: bool = sqlx::query_scalar(sql("publication_exists"))
        .bind(publication)
        .fetch_one(pool)
        .await
        .unwrap_or(false);
    let setup = format!(
        "outbox migrate --cdc --database-url … --schema {} --table {}",
        tables.schema().as_str(),
        tables.events().as_str()
    );
    checks.push(if published {
        Check::ok(AREA, format!("publication {publication}"), "exists")
    } else {
        Check::fail(
            AREA,
            format!("publication {publication}"),
            "missing",
            setup.clone(),
        )
    });
    let slots = outbox::postgres::cdc::slots(pool, tables)
        .await
        .unwrap_or_default();
    let Some(status) = slots.iter().find(|s| s.slot == slot) else {
        checks.push(Check::fail(
            AREA,
            format!("slot {slot}"),
            "missing: not set up for this outbox",
            setup,
        ));
        return checks;
    };
    if !status.exists || status.wal_status.as_deref() == Some("lost") {
        checks.push(Check::fail(
            AREA,
            format!("slot {slot}"),
            "lost (dropped, or invalidated by max_slot_wal_keep_size): events written while it \
             was gone are caught up from the table by the next set-up",
            setup,
        ));
        return checks;
    }
    let mb =
        |bytes: Option<i64>| bytes.map_or("-".to_owned(), |b| format!("{:.1} MB", b as f64 / 1e6));
    let detail = format!(
        "{} by {}; lag {}, retained WAL {} ({})",
        "streamed",
        status
            .active_pid
            .map_or("no relay".to_owned(), |pid| format!("walsender pid {pid}")),
        mb(status.lag_bytes),
        mb(status.retained_bytes),
        status.wal_status.as_deref().unwrap_or("-"),
    );
    let retained = status.retained_bytes.unwrap_or(0).max(0) as u64;
    checks.push(if retained > cdc.max_retained_wal_bytes {
        Check::fail(
            AREA,
            format!("slot {slot}"),
            detail,
            "start a CDC relay (or drop the slot with `outbox migrate --drop-cdc` if CDC is \
             abandoned): the slot retains WAL past cdc.max_retained_wal_bytes",
        )
    } else if status.active_pid.is_none() && retained > cdc.max_retained_wal_bytes / 2 {
        Check::warn(
            AREA,
            format!("slot {slot}"),
            detail,
            "start a CDC relay: nobody reads the slot and its retained WAL grows",
        )
    } else {
        Check::ok(AREA, format!("slot {slot}"), detail)
    });
    checks
}
