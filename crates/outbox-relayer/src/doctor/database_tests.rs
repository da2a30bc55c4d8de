use super::*;
use crate::doctor::Level;

const SHIPPED: Shipped = &[(1, "create", ""), (2, "leases", ""), (3, "audit", "")];

fn tables() -> Tables {
    Tables::new("outbox", "events").expect("valid names")
}

fn migrations(applied: Applied) -> (bool, Check) {
    let mut checks = Vec::new();
    let go_on = Migrations {
        applied,
        shipped: SHIPPED,
    }
    .check(&mut checks, &tables());
    assert_eq!(checks.len(), 1, "one migrations check: {checks:?}");
    (go_on, checks.remove(0))
}

#[test]
fn every_shipped_migration_applied_is_current() {
    let (go_on, check) = migrations(Applied::Versions(vec![1, 2, 3]));
    assert!(go_on);
    assert_eq!(check.level, Level::Ok);
    assert_eq!(check.detail, "current (3 applied)");
}

#[test]
fn a_missing_migration_is_named_and_stops_the_checks() {
    let (go_on, check) = migrations(Applied::Versions(vec![1, 3]));
    assert!(!go_on);
    assert_eq!(check.level, Level::Fail);
    assert_eq!(check.detail, "2 of 3 applied; missing: 2 (leases)");
    assert_eq!(
        check.fix.as_deref(),
        Some("outbox migrate --database-url … --schema outbox --table events")
    );
}

#[test]
fn a_migration_newer_than_the_build_stops_the_checks() {
    let (go_on, check) = migrations(Applied::Versions(vec![1, 2, 3, 4]));
    assert!(!go_on);
    assert_eq!(check.level, Level::Fail);
    assert!(
        check.detail.contains("at migration 4, newer than"),
        "{check:?}"
    );
}

#[test]
fn no_migrations_table_is_not_migrated() {
    let (go_on, check) = migrations(Applied::NotMigrated);
    assert!(!go_on);
    assert_eq!(
        check.detail,
        "the outbox outbox.events is not migrated (no migrations table)"
    );
}

#[test]
fn an_unreadable_migrations_table_fails_but_the_checks_go_on() {
    let (go_on, check) = migrations(Applied::Unreadable("permission denied".into()));
    assert!(go_on, "the privileges check says which tables");
    assert_eq!(check.level, Level::Fail);
    assert_eq!(check.detail, "cannot be read: permission denied");
}

fn partition(partition: i32, owner: Option<&str>, live: bool, pending: i64) -> PartitionStatus {
    PartitionStatus {
        partition,
        owner: owner.map(str::to_owned),
        epoch: 1,
        live,
        pending,
        oldest_age_seconds: None,
    }
}

#[test]
fn no_leases_table_rows_report_nothing_about_relays() {
    assert!(relays(&[]).is_empty());
}

#[test]
fn no_live_relay_with_events_pending_warns_with_the_count() {
    let checks = relays(&[
        partition(0, Some("r1"), false, 3),
        partition(1, None, false, 4),
    ]);
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].level, Level::Warn);
    assert_eq!(
        checks[0].detail,
        "no relay holds a lease, and 7 events are pending"
    );
    let idle = relays(&[partition(0, None, false, 0)]);
    assert_eq!(idle[0].level, Level::Ok);
    assert_eq!(idle[0].detail, "none running (nothing pending)");
}

#[test]
fn live_relays_are_named_once_and_unowned_partitions_warn() {
    let checks = relays(&[
        partition(0, Some("r2"), true, 0),
        partition(1, Some("r1"), true, 0),
        partition(2, Some("r2"), true, 0),
        partition(3, Some("gone"), false, 5),
    ]);
    assert_eq!(checks.len(), 2);
    assert_eq!(checks[0].detail, "2: r1, r2");
    assert_eq!(checks[1].level, Level::Warn);
    assert!(
        checks[1]
            .detail
            .starts_with("1 of 4 have no live lease (5 events pending"),
        "{:?}",
        checks[1]
    );
    let all = relays(&[partition(0, Some("r1"), true, 0)]);
    assert_eq!(all[1].level, Level::Ok);
    assert_eq!(all[1].detail, "all 1 owned by a live lease");
}

#[test]
fn an_unreachable_database_gets_the_fix_its_error_points_to() {
    let fix = |error: &str| unreachable(error, "db:5432").fix.expect("a fix");
    assert!(fix("Connection refused (os error 111)").contains("start the database server"));
    assert!(fix("password authentication failed for user \"x\"").contains("user and password"));
    assert!(fix("Access denied for user 'x'@'localhost'").contains("user and password"));
    assert!(fix("database \"nope\" does not exist").contains("create the database"));
    // PostgreSQL's unknown user: the user is wrong, not the database.
    assert!(fix("role \"nobody\" does not exist").contains("user and password"));
    assert!(fix("error with TLS handshake").contains("TLS settings"));
    assert!(fix("failed to lookup address information").contains("db:5432 does not resolve"));
    assert!(fix("something else").contains("the server at db:5432 is up"));
    let check = unreachable("Connection refused", "db:5432");
    assert_eq!((check.area, check.name.as_str()), ("database", "reachable"));
    assert_eq!(check.level, Level::Fail);
    assert_eq!(check.detail, "Connection refused");
}
