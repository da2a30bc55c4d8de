//! `outbox migrate | relay | status` on a SQLite file, publishing to NATS JetStream.

mod support;

use std::{process::Stdio, time::Duration};

use outbox::{sqlite::SqliteOutbox, Event, Tables};
use outbox_testkit::{unique, wait_until, NatsReader, Report, NATS_URL};
use sqlx::sqlite::SqlitePoolOptions;

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

    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let config = support::fast_config(&prefix, &format!("[nats]\nstream = \"{stream}\""));
    let mut relay = support::bin()
        .args([
            "relay",
            "--database-url",
            &url,
            "--broker-url",
            NATS_URL,
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deliveries = reader.wait_for(40, Duration::from_secs(60)).await;
    let report = Report::of(&deliveries);
    assert_eq!(report.unique, 40);
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
    reader.cleanup().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let _ = std::fs::remove_file(config);
}
