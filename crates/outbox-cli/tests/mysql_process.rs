//! The `outbox` binary on a MySQL-family outbox (the machine's MariaDB): migrate, two relay
//! processes with one killed, status, dead letters, purge and verify, through the same
//! contracts as on PostgreSQL and SQLite.

mod support;

use std::time::Duration;

use outbox::Event;
use outbox_testkit::{unique, wait_until, MySqlDb, NatsReader, Report, NATS_URL};
use support::{fast_config, run, RelayProcess};

const WAIT: Duration = Duration::from_secs(90);

fn out(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_mysql_outbox_is_migrated_relayed_by_two_processes_and_reported() {
    let db = MySqlDb::new(8).await;
    let o = run(&["migrate", "--database-url", &db.url]);
    assert_eq!(
        out(&o).0,
        "outbox outbox_events is up to date\n",
        "{:?}",
        out(&o)
    );
    let o = run(&["migrate", "--database-url", &db.url, "--partitions", "7"]);
    assert!(
        out(&o).1.contains("created with 8 partitions, 7 requested"),
        "{:?}",
        out(&o)
    );
    let events: Vec<Event> = (1..=25)
        .flat_map(|v| {
            (0..12)
                .map(move |a| Event::new("order", format!("a{a}"), "Placed").aggregate_version(v))
        })
        .collect();
    db.enqueue(&events).await;

    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let config = fast_config(&prefix, &format!("[nats]\nstream = \"{stream}\""));
    let start = || {
        RelayProcess::start_on(
            &["--database-url", &db.url],
            NATS_URL,
            &config,
            "127.0.0.1:0",
            &[],
        )
    };
    let mut first = start();
    let mut second = start();
    reader.wait_for(50, WAIT).await;
    // SIGKILL: its leases expire and the other process takes them over.
    first.kill();
    let deliveries = reader.wait_for(events.len(), WAIT).await;
    let report = Report::of(&deliveries);
    assert_eq!(report.unique, events.len());
    assert_eq!(report.order_violations, 0);
    wait_until("status to show nothing pending", WAIT, || async {
        let o = run(&["status", "--database-url", &db.url, "--json"]);
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        doc["pending"] == 0
            && doc["dead"] == 0
            && doc["partitions"].as_array().is_some_and(|p| {
                p.len() == 8
                    && p.iter()
                        .all(|p| p["owner"].is_string() && p["live"] == true)
            })
    })
    .await;
    assert!(second.terminate(), "SIGTERM stops the relay cleanly");

    // The stream against the outbox: every published row is there, once.
    let o = run(&[
        "verify",
        "--database-url",
        &db.url,
        "--broker-url",
        NATS_URL,
        "--stream",
        &stream,
        "--json",
    ]);
    let verdict: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", out(&o)));
    assert_eq!(o.status.code(), Some(0), "{verdict}");
    assert_eq!(verdict["published"], serde_json::json!(events.len()));
    reader.cleanup().await;
}

#[tokio::test]
async fn dead_letters_are_replayed_and_published_rows_purged() {
    let db = MySqlDb::new(1).await;
    let events: Vec<Event> = (1..=3)
        .map(|v| Event::new("order", "a0", "Placed").aggregate_version(v))
        .chain((0..4).map(|i| Event::new("invoice", format!("i{i}"), "Sent")))
        .collect();
    db.enqueue(&events).await;
    // As the relay leaves them: order/a0 v1 dead and parking v2, v3; the invoices published
    // ten days ago.
    db.exec(
        "UPDATE {events} SET status = 'dead', attempts = 5, last_error = 'permanent: unroutable'
         WHERE aggregate_type = 'order' AND aggregate_version = 1;
         UPDATE {events} SET next_attempt_at = '9999-12-31'
         WHERE aggregate_type = 'order' AND status = 'pending';
         INSERT INTO {holds} (aggregate_type, aggregate_id, `partition`, event_id, held_until,
                              created_at)
         SELECT aggregate_type, aggregate_id, `partition`, id, NULL, 0 FROM {events}
         WHERE status = 'dead';
         UPDATE {events} SET status = 'published',
                published_at = UTC_TIMESTAMP(6) - INTERVAL 10 DAY
         WHERE aggregate_type = 'invoice';",
    )
    .await;
    let dl = |extra: &[&str]| {
        let mut args = vec!["dead-letters", extra[0], "--database-url", &db.url];
        args.extend(&extra[1..]);
        run(&args)
    };
    let o = dl(&["list", "--error", "UNROUTABLE", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["parked"], true);
    assert_eq!(list[0]["aggregate_id"], "a0");
    let dead = list[0]["id"].as_i64().unwrap().to_string();
    let o = dl(&[
        "replay",
        "--id",
        &dead,
        "--reason",
        "route fixed",
        "--actor",
        "ops",
    ]);
    assert!(
        out(&o).0.contains("replayed 1 dead letters"),
        "{:?}",
        out(&o)
    );
    let audit = out(&dl(&["audit"])).0;
    assert!(
        audit.contains("replay  by ops") && audit.contains(&format!("[{dead}]")),
        "{audit}"
    );

    let o = run(&[
        "purge",
        "--database-url",
        &db.url,
        "--older-than",
        "7d",
        "--batch",
        "3",
    ]);
    assert!(
        out(&o)
            .0
            .contains("purged 4 published events older than 7days"),
        "{:?}",
        out(&o)
    );
    assert_eq!(db.count("published").await, 0);
    assert_eq!(
        db.count("pending").await,
        3,
        "pending rows are never purged"
    );

    // The replayed head goes first, then its parked successors, in order.
    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let config = fast_config(&prefix, &format!("[nats]\nstream = \"{stream}\""));
    let mut relay = RelayProcess::start_on(
        &["--database-url", &db.url],
        NATS_URL,
        &config,
        "127.0.0.1:0",
        &[],
    );
    let got = reader.wait_for(3, WAIT).await;
    assert!(relay.terminate());
    let versions: Vec<Option<i64>> = got.iter().map(|d| d.version).collect();
    assert_eq!(versions, vec![Some(1), Some(2), Some(3)]);
    reader.cleanup().await;
}

#[test]
fn a_refused_mysql_login_is_reported_without_the_password() {
    let out = run(&[
        "status",
        "--database-url",
        "mysql://root:s3cret-word@127.0.0.1:3306/test",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot connect to the database"), "{err}");
    assert!(!err.contains("s3cret-word"), "the password leaked: {err}");
}
