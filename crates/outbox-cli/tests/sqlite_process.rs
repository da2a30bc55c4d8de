//! `outbox migrate | relay | status` on a SQLite file, publishing to NATS JetStream.

mod support;

use std::{process::Stdio, time::Duration};

use outbox::{sqlite::SqliteOutbox, Event, Outbox, Tables};
use outbox_testkit::{unique, wait_until, NatsReader, Report, NATS_URL};
use sqlx::sqlite::SqlitePoolOptions;

/// `outbox relay` on the SQLite file at `url`, publishing to NATS, its admin port chosen by
/// the system.
fn relay_on(url: &str) -> std::process::Command {
    let mut command = support::bin();
    command.args([
        "relay",
        "--database-url",
        url,
        "--broker-url",
        NATS_URL,
        "--listen",
        "127.0.0.1:0",
    ]);
    command
}

#[tokio::test]
async fn a_sqlite_outbox_is_migrated_relayed_and_reported_by_the_cli() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("cli")));
    let url = format!("sqlite://{}", path.display());
    let out = support::run(&["migrate", "--database-url", &url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "outbox outbox_events is up to date\n",
        "the table SQLite holds, not a PostgreSQL name"
    );
    let out = support::run(&["migrate", "--database-url", &url, "--partitions", "8"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("one partition"));

    let pool = SqlitePoolOptions::new().connect(&url).await.unwrap();
    let outbox = SqliteOutbox::new(Tables::default());
    let mut tx = pool.begin().await.unwrap();
    let events: Vec<Event> = (1..=40)
        .map(|v| Event::new("cart", format!("c{}", v % 4), "ItemAdded").aggregate_version(v))
        .collect();
    outbox.enqueue_batch(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    // A row written by another language, its event id in upper case.
    sqlx::query(
        "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, payload)
         VALUES ('0190A0B0-0000-7000-8000-00000000000B', 'cart', 'upper', 'ItemAdded', x'7b7d')",
    )
    .execute(&pool)
    .await
    .unwrap();

    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let config = support::fast_config(&prefix, &format!("[nats]\nstream = \"{stream}\""));
    let mut relay = relay_on(&url)
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deliveries = reader.wait_for(41, Duration::from_secs(60)).await;
    let report = Report::of(&deliveries);
    assert_eq!(report.unique, 41);
    assert_eq!(report.order_violations, 0);
    wait_until(
        "status to show nothing pending",
        Duration::from_secs(30),
        || async {
            let out = support::run(&["status", "--database-url", &url, "--json"]);
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            doc["pending"] == 0 && doc["dead"] == 0
        },
    )
    .await;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status();
    assert!(relay.wait().unwrap().success());
    // verify finds every event in the stream, the upper-case id's too.
    let out = support::run(&[
        "verify",
        "--database-url",
        &url,
        "--broker-url",
        NATS_URL,
        "--stream",
        &stream,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("outbox events in window: 41 (41 published)"),
        "{text}"
    );
    reader.cleanup().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let _ = std::fs::remove_file(config);
}

/// `outbox relay 2>&1 | head`: once the reader of its stderr is gone, its log lines cannot be
/// written. SIGTERM still stops it (before the fix, reporting the failed write panicked the
/// task that handles SIGTERM, and the relay ran on until SIGKILL).
#[tokio::test]
async fn sigterm_stops_a_relay_whose_stderr_reader_is_gone() {
    use std::io::{BufRead, BufReader};
    let path = std::env::temp_dir().join(format!("{}.db", unique("closed")));
    let url = format!("sqlite://{}", path.display());
    assert!(support::run(&["migrate", "--database-url", &url])
        .status
        .success());
    let mut relay = relay_on(&url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It has started logging; then the pipe's only reader goes away.
    let mut first = String::new();
    BufReader::new(relay.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("INFO"), "{first}");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status();
    let mut status = None;
    wait_until(
        "the relay to stop on SIGTERM",
        Duration::from_secs(30),
        || {
            status = status.or_else(|| relay.try_wait().unwrap());
            let stopped = status.is_some();
            async move { stopped }
        },
    )
    .await;
    if status.is_none() {
        let _ = relay.kill();
    }
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
