//! `outbox demo`, the README's first command: no services, a crash, lost acks, and a summary
//! counted from the database.

mod support;

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
}

#[test]
fn a_database_url_without_a_broker_url_is_refused() {
    let out = support::run(&["demo", "--database-url", "postgres://x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--broker-url"));
}
