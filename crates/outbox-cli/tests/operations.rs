//! `outbox purge` and `outbox dead-letters` against PostgreSQL.

mod support;

use std::time::Duration;

use outbox_testkit::{
    database_url, insert_sequences, unique, wait_until, NatsReader, Report, TestDb, NATS_URL,
};
use support::{fast_config, run, RelayProcess};

const WAIT: Duration = Duration::from_secs(60);

fn out(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test]
async fn purge_deletes_only_published_rows_older_than_the_retention() {
    let db = TestDb::new(4).await;
    insert_sequences(&db, "order", 10, 3, 30).await;
    db.exec(
        "UPDATE {schema}.{events} SET status = 'published', published_at = now() - interval '10 days'
         WHERE id IN (SELECT id FROM {schema}.{events} ORDER BY id LIMIT 20);
         UPDATE {schema}.{events} SET status = 'published', published_at = now()
         WHERE id IN (SELECT id FROM {schema}.{events} WHERE status = 'pending' ORDER BY id LIMIT 5);
         UPDATE {schema}.{events} SET status = 'dead', occurred_at = now() - interval '30 days'
         WHERE id IN (SELECT id FROM {schema}.{events} WHERE status = 'pending' ORDER BY id LIMIT 3);",
    )
    .await;
    let url = database_url();
    let base = ["purge", "--database-url", &url, "--schema", &db.schema];
    let o = run(&[&base[..], &["--older-than", "7d", "--dry-run"]].concat());
    assert!(
        out(&o)
            .0
            .contains("dry run: 20 published events older than 7days would be deleted"),
        "{:?}",
        out(&o)
    );
    assert_eq!(db.count("published").await, 25);
    let o = run(&[&base[..], &["--older-than", "7d", "--batch", "7"]].concat());
    assert!(o.status.success(), "{:?}", out(&o));
    assert!(
        out(&o)
            .0
            .contains("purged 20 published events older than 7days"),
        "{:?}",
        out(&o)
    );
    assert_eq!(db.count("published").await, 5);
    assert_eq!(db.count("dead").await, 3, "dead rows are never purged");
    assert_eq!(
        db.count("pending").await,
        2,
        "pending rows are never purged"
    );
    let o = run(&[&base[..], &["--older-than", "soon"]].concat());
    assert_eq!(o.status.code(), Some(2));
    assert!(out(&o).1.contains("--older-than"), "{:?}", out(&o));
}

#[tokio::test]
async fn a_purge_racing_the_relay_loses_nothing_pending() {
    let db = TestDb::new(8).await;
    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let written = insert_sequences(&db, "order", 100, 30, 500).await;
    let config = fast_config(&prefix, &format!("[nats]\nstream = \"{stream}\""));
    let relay = RelayProcess::start(&db, NATS_URL, &config, "127.0.0.1:0");
    let url = database_url();
    let mut purged = 0u64;
    while db.count("pending").await > 0 {
        let o = run(&[
            "purge",
            "--database-url",
            &url,
            "--schema",
            &db.schema,
            "--older-than",
            "1ms",
            "--batch",
            "100",
        ]);
        assert!(o.status.success(), "{:?}", out(&o));
        let text = out(&o).0;
        purged += text
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
    }
    let deliveries = reader.wait_for(written, WAIT).await;
    drop(relay);
    let report = Report::of(&deliveries);
    println!("purge racing the relay: {written} written, {purged} purged meanwhile, {report:?}");
    assert_eq!(
        report.unique, written,
        "every event delivered although purged right after"
    );
    assert_eq!(report.order_violations, 0);
    assert!(purged > 0, "the purge ran while the relay worked");
    reader.cleanup().await;
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn dead_letters_are_listed_replayed_in_order_and_skipped_with_an_audit_trail() {
    let db = TestDb::new(4).await;
    insert_sequences(&db, "order", 1, 3, 10).await; // a0 v1..v3
    insert_sequences(&db, "invoice", 2, 1, 10).await; // a0, a1
                                                      // As the relay leaves them: order/a0 v1 dead and parking v2, v3; two dead invoices.
    db.exec(
        "UPDATE {schema}.{events} SET status = 'dead', attempts = 5,
             last_error = 'permanent: rabbitmq: unroutable'
         WHERE aggregate_type = 'order' AND aggregate_version = 1;
         UPDATE {schema}.{events} SET status = 'dead', attempts = 5, last_error = 'permanent: Timeout at receiver'
         WHERE aggregate_type = 'invoice';
         INSERT INTO {schema}.holds (aggregate_type, aggregate_id, partition, event_id, held_until)
         SELECT aggregate_type, aggregate_id, partition, id, NULL FROM {schema}.{events}
         WHERE status = 'dead';",
    )
    .await;
    let url = database_url();
    let dl = |extra: &[&str]| {
        let mut args = vec!["dead-letters"];
        args.push(extra[0]);
        args.extend(["--database-url", &url, "--schema", &db.schema]);
        args.extend(&extra[1..]);
        run(&args)
    };
    let o = dl(&["list", "--aggregate-type", "order", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["parked"], true);
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
        "2026-12-01T00:00:00Z",
        "--until",
        "2026-11-01T00:00:00Z",
    ]);
    assert!(
        out(&o).1.contains("must be before --until"),
        "{:?}",
        out(&o)
    );
    let o = dl(&["show", &order_dead]);
    assert!(
        out(&o).0.contains("payload: {\"a\":0,\"v\":1}"),
        "{:?}",
        out(&o)
    );
    let o = dl(&["show", "999999999"]);
    assert!(out(&o).1.contains("no dead letter with id 999999999"));

    let o = dl(&["replay"]);
    assert!(out(&o).1.contains("replay needs --id, a filter, or --all"));
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

    let invoices: Vec<i64> =
        sqlx::query_scalar(&db.tables.render(
            "SELECT id FROM {schema}.{events} WHERE aggregate_type = 'invoice' ORDER BY id",
        ))
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let first = invoices[0].to_string();
    let o = dl(&["skip", "--id", &first]);
    assert_eq!(o.status.code(), Some(2), "a skip needs a reason");
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
    assert_eq!(
        db.count("dead").await,
        2,
        "skipped events stay dead, for the record"
    );
    let o = dl(&["audit"]);
    let audit = out(&o).0;
    assert!(
        audit.contains("skip    by ops-ana") && audit.contains("invoice cancelled"),
        "{audit}"
    );
    assert!(
        audit.contains("replay  by ops-ana") && audit.contains("exchange binding fixed"),
        "{audit}"
    );

    // The replayed head goes first, then its parked successors, in order.
    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let config = fast_config(&prefix, &format!("[nats]\nstream = \"{stream}\""));
    let relay = RelayProcess::start(&db, NATS_URL, &config, "127.0.0.1:0");
    let got = reader.wait_for(3, WAIT).await;
    wait_until("the order aggregate to drain", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
    drop(relay);
    let versions: Vec<Option<i64>> = got.iter().map(|d| d.version).collect();
    assert_eq!(versions, vec![Some(1), Some(2), Some(3)]);
    reader.cleanup().await;
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn purge_can_archive_instead_and_purge_the_inbox_too() {
    let db = TestDb::new(4).await;
    insert_sequences(&db, "order", 4, 2, 10).await;
    db.exec(
        "UPDATE {schema}.{events} SET status = 'published', published_at = now() - interval '3 days';
         INSERT INTO {schema}.inbox (consumer, event_id, processed_at)
         SELECT 'billing', event_id::text, now() - interval '40 days' FROM {schema}.{events};",
    )
    .await;
    let url = database_url();
    let o = run(&[
        "purge",
        "--database-url",
        &url,
        "--schema",
        &db.schema,
        "--older-than",
        "1d",
        "--archive",
        "--inbox-older-than",
        "30d",
    ]);
    let (stdout, stderr) = out(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stdout.contains("archived 8 published events older than 1day"),
        "{stdout}"
    );
    assert!(
        stdout.contains("purged 8 inbox rows older than 30days"),
        "{stdout}"
    );
    let archived: i64 = sqlx::query_scalar(
        &db.tables
            .render("SELECT count(*) FROM {schema}.events_archive WHERE status = 'published'"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(archived, 8);
    assert_eq!(db.count("published").await, 0);
}
