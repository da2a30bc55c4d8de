//! `outbox demo`, the README's first command: no services, a crash, lost acks, and a summary
//! counted from the database.

mod support;

/// The number on the summary line that starts with `label`.
fn figure(stdout: &str, label: &str) -> i64 {
    stdout
        .lines()
        .find_map(|line| line.trim_start().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figure for {label:?} in:\n{stdout}"))
}

#[test]
fn the_demo_survives_a_relay_crash_and_lost_acks_with_nothing_lost_or_applied_twice() {
    let out = support::run(&["demo", "--orders", "120", "--drop-ack-every", "7"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("orders created                     120"),
        "{stdout}"
    );
    assert_eq!(figure(&stdout, "relay crashes injected"), 1, "{stdout}");
    assert!(stdout.contains("0 lost, 0 applied twice: OK"), "{stdout}");
    assert_eq!(
        figure(&stdout, "events published"),
        figure(&stdout, "events written (same tx)"),
        "{stdout}"
    );
    let duplicates: u64 = stdout
        .lines()
        .find(|l| l.contains("duplicates discarded by inbox"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|n| n.parse().ok())
        .expect("duplicates line");
    assert!(
        duplicates > 0,
        "lost acks must cause redeliveries: {stdout}"
    );
}

#[test]
fn every_figure_of_the_demo_summary_is_counted_once_the_relay_has_marked_what_it_delivered() {
    // Every second acknowledgement is lost: the consumers apply the last events before the
    // relay, retrying them after a backoff, gets the acknowledgement it can mark them with.
    let out = support::run(&["demo", "--orders", "60", "--drop-ack-every", "2"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(figure(&stdout, "orders created"), 60, "{stdout}");
    assert_eq!(figure(&stdout, "events written (same tx)"), 60, "{stdout}");
    assert_eq!(
        figure(&stdout, "events published"),
        60,
        "every event the consumers applied is marked published before the summary: {stdout}"
    );
    assert_eq!(figure(&stdout, "notifications sent"), 60, "{stdout}");
    assert!(stdout.contains("0 lost, 0 applied twice: OK"), "{stdout}");
}

#[test]
fn the_demo_runs_on_postgres_and_nats_when_given_urls() {
    let out = support::run(&[
        "demo",
        "--orders",
        "80",
        "--database-url",
        &outbox_testkit::database_url(),
        "--broker-url",
        outbox_testkit::NATS_URL,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("relay crashes injected               1"),
        "{stdout}"
    );
    assert!(stdout.contains("0 lost, 0 applied twice: OK"), "{stdout}");
    assert_eq!(
        figure(&stdout, "events published"),
        figure(&stdout, "events written (same tx)"),
        "{stdout}"
    );
}

#[tokio::test]
async fn the_demo_runs_on_mariadb_through_webhooks_and_removes_its_database() {
    let out = support::run(&[
        "demo",
        "--orders",
        "80",
        "--drop-ack-every",
        "5",
        "--database-url",
        &outbox_testkit::mysql_url(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("storage: MySQL/MariaDB (database orders_"),
        "{stdout}"
    );
    assert_eq!(figure(&stdout, "relay crashes injected"), 1, "{stdout}");
    assert_eq!(figure(&stdout, "events published"), 80, "{stdout}");
    assert_eq!(figure(&stdout, "notifications sent"), 80, "{stdout}");
    assert!(
        figure(&stdout, "duplicates discarded by inbox") > 0,
        "{stdout}"
    );
    assert!(stdout.contains("0 lost, 0 applied twice: OK"), "{stdout}");
    let database = stdout
        .split("(database ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("the database is named");
    let server = sqlx::MySqlPool::connect(&outbox_testkit::mysql_url())
        .await
        .unwrap();
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
    )
    .bind(database)
    .fetch_one(&server)
    .await
    .unwrap();
    assert_eq!(left, 0, "the run's database {database} is dropped");
}

#[test]
fn a_broker_url_with_a_mysql_database_is_refused_before_anything_is_created() {
    let out = support::run(&[
        "demo",
        "--database-url",
        &outbox_testkit::mysql_url(),
        "--broker-url",
        outbox_testkit::NATS_URL,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--broker-url"), "{stderr}");
    assert!(stderr.contains("postgres://"), "{stderr}");
}

#[test]
fn a_database_url_of_an_unknown_kind_is_refused_naming_it() {
    let out = support::run(&["demo", "--database-url", "oracle://x"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("oracle://x"), "{stderr}");
}
