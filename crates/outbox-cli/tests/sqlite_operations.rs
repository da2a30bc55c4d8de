//! `outbox purge`, `outbox dead-letters` and the dashboard on a SQLite outbox, the embedded
//! default: the same contracts as on PostgreSQL (`operations.rs`, `dashboard.rs`).

mod support;

use std::time::Duration;

use outbox::Event;
use outbox_testkit::{free_port, unique, wait_until, NatsReader, SqliteFile, NATS_URL};
use support::{fast_config, http, http_get, run, RelayProcess};

const WAIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "t0ken-for-tests";

fn out(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `count` events per aggregate for `aggregates` aggregates of `kind`: `a0` v1..v`count`, …
fn sequences(kind: &str, aggregates: usize, count: i64) -> Vec<Event> {
    (0..aggregates)
        .flat_map(|a| {
            (1..=count).map(move |v| {
                Event::new(kind, format!("a{a}"), "Happened")
                    .aggregate_version(v)
                    .json(&serde_json::json!({ "a": a, "v": v }))
                    .unwrap()
            })
        })
        .collect()
}

#[tokio::test]
async fn purge_deletes_or_archives_only_published_rows_older_than_the_retention() {
    let db = SqliteFile::new().await;
    db.enqueue(&sequences("order", 10, 3)).await;
    db.exec(
        "UPDATE {events} SET status = 'published',
             published_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-10 days')
         WHERE id IN (SELECT id FROM {events} ORDER BY id LIMIT 20);
         UPDATE {events} SET status = 'published',
             published_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-3 days')
         WHERE id IN (SELECT id FROM {events} WHERE status = 'pending' ORDER BY id LIMIT 5);
         UPDATE {events} SET status = 'dead',
             occurred_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-30 days')
         WHERE id IN (SELECT id FROM {events} WHERE status = 'pending' ORDER BY id LIMIT 3);
         -- Written by hand: a published row whose time is not one is never taken for old.
         INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload,
                               status, published_at)
         VALUES ('0192f5a4-0000-7000-8000-000000000001', 'note', 'n1', 'Written', x'7b7d',
                 'published', 'last tuesday');
         INSERT INTO {inbox} (consumer, event_id, processed_at)
         SELECT 'billing', event_id, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-40 days')
         FROM {events};",
    )
    .await;
    let base = ["purge", "--database-url", &db.url];
    let o = run(&[&base[..], &["--older-than", "7d", "--dry-run"]].concat());
    assert!(
        out(&o)
            .0
            .contains("dry run: 20 published events older than 7days would be deleted"),
        "{:?}",
        out(&o)
    );
    assert_eq!(db.count("published").await, 26);
    let o = run(&[&base[..], &["--older-than", "7d", "--batch", "7"]].concat());
    assert!(o.status.success(), "{:?}", out(&o));
    assert!(
        out(&o)
            .0
            .contains("purged 20 published events older than 7days"),
        "{:?}",
        out(&o)
    );
    assert_eq!(db.count("published").await, 6);
    assert_eq!(db.count("dead").await, 3, "dead rows are never purged");
    assert_eq!(
        db.count("pending").await,
        2,
        "pending rows are never purged"
    );

    let o = run(&[
        &base[..],
        &[
            "--older-than",
            "1d",
            "--archive",
            "--inbox-older-than",
            "30d",
        ],
    ]
    .concat());
    let (stdout, stderr) = out(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stdout.contains("archived 5 published events older than 1day"),
        "{stdout}"
    );
    assert!(
        stdout.contains("purged 31 inbox rows older than 30days"),
        "{stdout}"
    );
    let archived: Vec<(String, String)> = sqlx::query_as(
        &db.tables
            .render_sqlite("SELECT status, aggregate_type FROM {events}_archive"),
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(archived.len(), 5);
    assert!(archived
        .iter()
        .all(|(s, t)| s == "published" && t == "order"));
    assert_eq!(db.count("published").await, 1, "the row without a time");

    let o = run(&[
        &base[..],
        &["--older-than", "1d", "--sagas-older-than", "30d"],
    ]
    .concat());
    assert!(!o.status.success());
    assert!(
        out(&o).1.contains("sagas are stored on PostgreSQL only"),
        "{:?}",
        out(&o)
    );
}

#[tokio::test]
async fn dead_letters_are_listed_replayed_in_order_and_skipped_with_an_audit_trail() {
    let db = SqliteFile::new().await;
    db.enqueue(&sequences("order", 1, 3)).await; // a0 v1..v3
    db.enqueue(&sequences("invoice", 2, 1)).await; // a0, a1
    db.exec(
        // As the relay leaves them: order/a0 v1 dead and parking v2, v3; two dead invoices.
        "UPDATE {events} SET status = 'dead', attempts = 5,
             last_error = 'permanent: rabbitmq: unroutable'
         WHERE aggregate_type = 'order' AND aggregate_version = 1;
         UPDATE {events} SET status = 'dead', attempts = 5,
             last_error = 'permanent: Timeout at receiver'
         WHERE aggregate_type = 'invoice';
         UPDATE {events} SET next_attempt_at = 'infinity'
         WHERE aggregate_type = 'order' AND status = 'pending';
         INSERT INTO {holds} (aggregate_type, aggregate_id, partition, event_id, held_until,
                              created_at)
         SELECT aggregate_type, aggregate_id, partition, id, NULL, 0 FROM {events}
         WHERE status = 'dead';",
    )
    .await;
    let dl = |extra: &[&str]| {
        let mut args = vec!["dead-letters", extra[0], "--database-url", &db.url];
        args.extend(&extra[1..]);
        run(&args)
    };
    let o = dl(&["list", "--aggregate-type", "order", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["parked"], true);
    assert_eq!(list[0]["payload_size"], 13);
    assert!(list[0]["occurred_at"].is_string(), "{list}");
    let order_dead = list[0]["id"].as_i64().unwrap().to_string();
    let o = dl(&["list", "--error", "TIMEOUT"]);
    assert_eq!(
        out(&o).0.lines().count(),
        3,
        "header + 2 invoices: {:?}",
        out(&o)
    );
    let o = dl(&[
        "list",
        "--since",
        "2000-01-01T00:00:00Z",
        "--until",
        "2000-01-02T00:00:00Z",
    ]);
    assert_eq!(out(&o).0.lines().count(), 1, "none in 2000: {:?}", out(&o));
    let o = dl(&["show", &order_dead]);
    assert!(
        out(&o).0.contains("payload: {\"a\":0,\"v\":1}"),
        "{:?}",
        out(&o)
    );
    let o = dl(&["show", "999999999"]);
    assert!(out(&o).1.contains("no dead letter with id 999999999"));

    let o = dl(&["replay", "--id", &order_dead, "--dry-run"]);
    assert!(out(&o).0.contains("1 dead letters would be replayed"));
    assert_eq!(db.count("dead").await, 3);
    let o = dl(&[
        "replay",
        "--id",
        &order_dead,
        "--reason",
        "exchange binding fixed",
        "--actor",
        "ops-ana",
    ]);
    assert!(
        out(&o).0.contains("replayed 1 dead letters"),
        "{:?}",
        out(&o)
    );
    assert_eq!(db.count("dead").await, 2);

    let invoices: Vec<i64> = sqlx::query_scalar(
        &db.tables
            .render_sqlite("SELECT id FROM {events} WHERE aggregate_type = 'invoice' ORDER BY id"),
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let first = invoices[0].to_string();
    let o = dl(&["skip", "--id", "424242424", "--reason", "x"]);
    assert!(
        out(&o).1.contains("not dead letters: [424242424]"),
        "{:?}",
        out(&o)
    );
    let o = dl(&[
        "skip",
        "--id",
        &first,
        "--reason",
        "invoice cancelled",
        "--actor",
        "ops-ana",
    ]);
    assert!(
        out(&o).0.contains("1 parked aggregates released"),
        "{:?}",
        out(&o)
    );
    assert_eq!(db.count("dead").await, 2, "skipped events stay dead");
    let audit = out(&dl(&["audit"])).0;
    assert!(
        audit.contains("skip    by ops-ana")
            && audit.contains(&format!("[{first}]"))
            && audit.contains("invoice cancelled"),
        "{audit}"
    );
    assert!(
        audit.contains("replay  by ops-ana")
            && audit.contains(&format!("[{order_dead}]"))
            && audit.contains("exchange binding fixed"),
        "{audit}"
    );

    // The replayed head goes first, then its parked successors, in order.
    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let config = fast_config(&prefix, &format!("[nats]\nstream = \"{stream}\""));
    let relay = RelayProcess::start_on(
        &["--database-url", &db.url],
        NATS_URL,
        &config,
        "127.0.0.1:0",
        &[],
    );
    let got = reader.wait_for(3, WAIT).await;
    wait_until("the order aggregate to drain", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
    drop(relay);
    let versions: Vec<Option<i64>> = got.iter().map(|d| d.version).collect();
    assert_eq!(versions, vec![Some(1), Some(2), Some(3)]);
    // The audit of the stream against the SQLite outbox: clean, then not, once a published
    // event's row says published but the stream lacks it.
    let verify = || {
        run(&[
            "verify",
            "--database-url",
            &db.url,
            "--broker-url",
            NATS_URL,
            "--stream",
            &stream,
            "--json",
        ])
    };
    let o = verify();
    let verdict: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{verdict}");
    assert_eq!(
        (
            &verdict["outbox_events"],
            &verdict["published"],
            &verdict["broker_messages"]
        ),
        (
            &serde_json::json!(5),
            &serde_json::json!(3),
            &serde_json::json!(3)
        ),
        "{verdict}"
    );
    db.exec(&format!(
        "UPDATE {{events}} SET status = 'published' WHERE id = {}",
        invoices[1]
    ))
    .await;
    let o = verify();
    let verdict: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(1), "{verdict}");
    assert_eq!(
        verdict["missing"].as_array().map(Vec::len),
        Some(1),
        "{verdict}"
    );
    reader.cleanup().await;
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn the_relay_serves_the_dashboard_and_purges_by_itself() {
    let db = SqliteFile::new().await;
    db.enqueue(&sequences("order", 4, 5)).await;
    db.enqueue(&sequences("invoice", 1, 2)).await;
    db.exec(
        "UPDATE {events} SET status = 'dead', last_error = 'permanent: unroutable'
         WHERE aggregate_type = 'invoice' AND aggregate_version = 1;
         UPDATE {events} SET next_attempt_at = 'infinity'
         WHERE aggregate_type = 'invoice' AND status = 'pending';
         INSERT INTO {holds} (aggregate_type, aggregate_id, partition, event_id, held_until,
                              created_at)
         SELECT aggregate_type, aggregate_id, partition, id, NULL, 0 FROM {events}
         WHERE status = 'dead';",
    )
    .await;
    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let config = fast_config(&prefix, &format!("[nats]\nstream = \"{stream}\""));
    let addr = format!("127.0.0.1:{}", free_port());
    let relay = RelayProcess::start_on(
        &["--database-url", &db.url],
        NATS_URL,
        &config,
        &addr,
        &[
            ("OUTBOX_ADMIN_TOKEN", TOKEN),
            ("OUTBOX_RELAY__PURGE_RETENTION", "1ms"),
            ("OUTBOX_RELAY__PURGE_INTERVAL", "200ms"),
        ],
    );
    // The 20 orders go out and are purged; the invoice waits behind its dead head.
    reader.wait_for(20, WAIT).await;
    wait_until("published rows to be purged", WAIT, || async {
        db.count("published").await == 0 && db.count("pending").await == 1
    })
    .await;
    let (status, body) = http_get(&addr, "/api/status").await.expect("dashboard");
    assert_eq!(status, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (doc["pending"].as_i64(), doc["dead"].as_i64()),
        (Some(1), Some(1)),
        "{doc}"
    );
    assert_eq!(doc["partitions"].as_array().map(Vec::len), Some(1), "{doc}");
    assert_eq!(doc["partitions"][0]["live"], true, "{doc}");
    let (_, body) = http_get(&addr, "/api/dead-letters").await.unwrap();
    let dead: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = dead[0]["id"].as_i64().unwrap();
    assert_eq!(dead[0]["parked"], true, "{dead}");

    let action = format!(r#"{{"ids":[{id}],"reason":"receiver fixed"}}"#);
    let json = ("Content-Type", "application/json");
    let (status, _) = http(&addr, "POST", "/api/dead-letters/replay", &[json], &action)
        .await
        .unwrap();
    assert_eq!(status, 401, "no token, no action");
    let bearer = format!("Bearer {TOKEN}");
    let (status, body) = http(
        &addr,
        "POST",
        "/api/dead-letters/replay",
        &[json, ("Authorization", &bearer)],
        &action,
    )
    .await
    .unwrap();
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"not_replayed":[],"replayed":1}"#)
    );
    let got = reader.wait_for(22, WAIT).await;
    let invoice: Vec<Option<i64>> = got
        .iter()
        .filter(|d| d.aggregate_type == "invoice")
        .map(|d| d.version)
        .collect();
    assert_eq!(invoice, vec![Some(1), Some(2)], "replayed head first");
    wait_until("all 22 published events to be purged", WAIT, || async {
        let metrics = http_get(&addr, "/metrics").await.unwrap_or_default().1;
        metrics.contains("outbox_purged_total 22")
    })
    .await;
    assert_eq!(db.count("published").await, 0);
    assert_eq!(db.count("pending").await, 0);
    assert_eq!(db.count("dead").await, 0);
    drop(relay);
    reader.cleanup().await;
    let _ = std::fs::remove_file(config);
}
