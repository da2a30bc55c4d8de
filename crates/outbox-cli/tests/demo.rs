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
    assert!(stdout.contains("relay crashes injected: 1"), "{stdout}");
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

#[test]
fn a_database_url_without_a_broker_url_is_refused() {
    let out = support::run(&["demo", "--database-url", "postgres://x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--broker-url"));
}
