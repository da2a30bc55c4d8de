//! `outbox sagas list | show` and the saga purge, against PostgreSQL.

mod support;

use outbox_testkit::{database_url, TestDb};
use support::run;

fn out(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Three instances of `order`: 1 open and overdue, 2 finished ten days ago, 3 finished now with
/// an unexpected event recorded; and an orphaned event for an order that never existed.
async fn sagas() -> TestDb {
    let db = TestDb::new(2).await;
    db.exec(
        "INSERT INTO {schema}.sagas (saga_type, correlation_id, state, data, version, deadline,
                                     finished, updated_at) VALUES
           ('order', '1', 'AwaitingInventory', '{\"sku\":\"apple\"}', 1,
            now() - interval '1 minute', false, now()),
           ('order', '2', 'Completed', '{}', 4, NULL, true, now() - interval '10 days'),
           ('order', '3', 'Cancelled', '{}', 3, NULL, true, now());
         INSERT INTO {schema}.saga_steps (saga_type, correlation_id, at, trigger, from_state,
                                          to_state, outcome, detail) VALUES
           ('order', '1', now(), 'OrderCreated', NULL, 'AwaitingInventory', 'started', NULL),
           ('order', '2', now() - interval '10 days', 'OrderCreated', NULL, 'AwaitingInventory',
            'started', NULL),
           ('order', '2', now() - interval '10 days', 'OrderShipped', 'AwaitingShipment',
            'Completed', 'transitioned', NULL),
           ('order', '3', now(), 'InventoryReserved', 'Cancelled', 'Cancelled', 'unexpected',
            'late inventory answer'),
           ('order', 'ghost', now() - interval '10 days', 'PaymentTaken', NULL, NULL, 'orphan',
            'no instance');",
    )
    .await;
    db
}

#[tokio::test]
async fn list_filters_and_counts_instances() {
    let db = sagas().await;
    let url = database_url();
    let base = [
        "sagas",
        "list",
        "--database-url",
        &url,
        "--schema",
        &db.schema,
    ];
    let o = run(&[&base[..], &["--json"]].concat());
    assert!(o.status.success(), "{:?}", out(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["instances"].as_array().unwrap().len(), 3);
    let awaiting = doc["counts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["state"] == "AwaitingInventory")
        .expect("a count per state");
    assert_eq!(
        (awaiting["instances"].as_i64(), awaiting["overdue"].as_i64()),
        (Some(1), Some(1))
    );

    for (filter, expected) in [("--overdue", "1"), ("--problems", "3")] {
        let o = run(&[&base[..], &[filter, "--json"]].concat());
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let ids: Vec<&str> = doc["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["correlation_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [expected], "{filter}");
    }
    let o = run(&[&base[..], &["--open"]].concat());
    let (text, _) = out(&o);
    assert!(
        text.contains("order AwaitingInventory: 1 instance(s), 1 overdue"),
        "{text}"
    );
    assert!(text.contains("AwaitingInventory"), "{text}");
    // The instances' table: type, correlation id, state, …; instance 2 is finished.
    let listed: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("type "))
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert!(!listed.is_empty(), "no instance listed: {text}");
    assert!(!listed.contains(&"2"), "finished instances hidden: {text}");
}

#[tokio::test]
async fn show_prints_the_state_data_and_every_step() {
    let db = sagas().await;
    let url = database_url();
    let base = [
        "sagas",
        "show",
        "--database-url",
        &url,
        "--schema",
        &db.schema,
    ];
    let o = run(&[&base[..], &["order", "3"]].concat());
    let (text, err) = out(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        text.contains("saga order \"3\": Cancelled, finished (version 3)"),
        "{text}"
    );
    assert!(text.contains("unexpected"), "{text}");
    assert!(text.contains("(late inventory answer)"), "{text}");

    let o = run(&[&base[..], &["order", "1", "--json"]].concat());
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["data"]["sku"], "apple");
    assert_eq!(doc["steps"][0]["outcome"], "started");

    let o = run(&[&base[..], &["order", "ghost"]].concat());
    assert!(o.status.success());
    assert!(
        out(&o).0.contains("no instance (events recorded)"),
        "{:?}",
        out(&o)
    );

    let o = run(&[&base[..], &["order", "nope"]].concat());
    assert!(!o.status.success());
    assert!(
        out(&o).1.contains("no saga order \"nope\""),
        "{:?}",
        out(&o)
    );
}

#[tokio::test]
async fn purge_removes_only_old_finished_sagas_and_stray_steps() {
    let db = sagas().await;
    let url = database_url();
    let o = run(&[
        "purge",
        "--database-url",
        &url,
        "--schema",
        &db.schema,
        "--older-than",
        "7d",
        "--sagas-older-than",
        "7d",
        "--batch",
        "1",
    ]);
    let (text, err) = out(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        text.contains("purged 1 finished sagas and 3 saga steps older than 7days"),
        "{text}"
    );
    let left: Vec<String> = sqlx::query_scalar(
        &db.tables
            .render("SELECT correlation_id FROM {schema}.sagas ORDER BY correlation_id"),
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(left, ["1", "3"], "open and recent instances stay");
    let steps: i64 =
        sqlx::query_scalar(&db.tables.render("SELECT count(*) FROM {schema}.saga_steps"))
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(steps, 2);
}
