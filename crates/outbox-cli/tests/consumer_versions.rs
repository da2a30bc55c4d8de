//! `outbox consumer-versions list | held | seed | skip`, against a consumer's real tables: what
//! an operator reads and changes when an aggregate waits for a version that will not come.

mod support;

use std::{collections::BTreeMap, sync::Arc};

use futures::future::BoxFuture;
use outbox_consumer::{
    ConsumerConfig, DeadLetters, Envelope, Handler, HandlerError, Message, Outcome, Processor,
    VersionGate,
};
use outbox_testkit::{database_url, TestDb};
use sqlx::PgConnection;
use support::run;
use uuid::Uuid;

/// Records each event applied.
struct Ledger(String);

impl Handler for Ledger {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            sqlx::query(&self.0)
                .bind(event.aggregate_id.as_deref())
                .bind(event.aggregate_version)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}

struct NoDeadLetters;

impl DeadLetters for NoDeadLetters {
    fn dead_letter<'a>(
        &'a self,
        _: &'a Message,
        reason: &'a str,
        _: u32,
        _: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { panic!("nothing is dead-lettered here: {reason}") })
    }
}

fn message(aggregate: &str, version: i64) -> Message {
    let headers: BTreeMap<String, String> = [
        ("event-id", Uuid::now_v7().to_string()),
        ("event-type", "OrderChanged".to_owned()),
        ("aggregate-type", "order".to_owned()),
        ("aggregate-id", aggregate.to_owned()),
        ("aggregate-version", version.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    Message::new("order.OrderChanged", headers, "{}")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

async fn applied(db: &TestDb, aggregate: &str) -> Vec<i64> {
    sqlx::query_scalar(
        &db.tables
            .render("SELECT version FROM {schema}.ledger WHERE aggregate_id = $1 ORDER BY n"),
    )
    .bind(aggregate)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

async fn audited(db: &TestDb, action: &str) -> Vec<(String, String, serde_json::Value)> {
    sqlx::query_as(
        &db.tables.render(
            "SELECT actor, reason, details FROM {schema}.audit WHERE action = $1 ORDER BY id",
        ),
    )
    .bind(action)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// `o-1` applied version 1 and holds 3 and 4 (version 2 was skipped on the relay's side);
/// `o-2` holds 2 and 3 (the consumer joined after version 1 was gone). The operator reads why,
/// skips o-1's gap, seeds o-2 from what it holds (a dry run first, a refusal to move back),
/// and the runner's sweep then applies everything, in order; each change is audited.
#[tokio::test]
async fn an_operator_reads_why_events_wait_and_moves_aggregates_on() {
    let db = TestDb::new(2).await;
    db.exec(
        "CREATE TABLE {schema}.ledger (n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             aggregate_id text NOT NULL, version bigint NOT NULL)",
    )
    .await;
    let ledger = Arc::new(Ledger(db.tables.render(
        "INSERT INTO {schema}.ledger (aggregate_id, version) VALUES ($1, $2)",
    )));
    let processor = Processor::new(db.pool.clone(), &db.tables, "billing", ledger)
        .with_version_gate(VersionGate::starting_at(1));
    for (aggregate, version, outcome) in [
        ("o-1", 1, Outcome::Applied),
        ("o-1", 3, Outcome::Held),
        ("o-1", 4, Outcome::Held),
        ("o-2", 2, Outcome::Held),
        ("o-2", 3, Outcome::Held),
    ] {
        let got = processor.apply(&message(aggregate, version)).await.unwrap();
        assert_eq!(got, outcome, "{aggregate} v{version}");
    }
    let url = database_url();
    let base = |action: &str| {
        vec![
            "consumer-versions".to_owned(),
            action.to_owned(),
            "--database-url".to_owned(),
            url.clone(),
            "--schema".to_owned(),
            db.schema.clone(),
            "--consumer".to_owned(),
            "billing".to_owned(),
        ]
    };
    let cli = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&refs)
    };
    let with = |mut args: Vec<String>, more: &[&str]| {
        args.extend(more.iter().map(|s| s.to_string()));
        args
    };

    // What waits, and why.
    let o = cli(with(base("list"), &["--held", "--json"]));
    assert!(o.status.success(), "{}", text(&o));
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = list.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{list}");
    let row = |id: &str| {
        rows.iter()
            .find(|r| r["aggregate_id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(row("o-1")["version"], 1);
    assert_eq!(row("o-1")["held"], 2);
    assert_eq!(row("o-1")["reason"], "waiting for version 2");
    assert_eq!(row("o-2")["version"], serde_json::Value::Null);
    assert_eq!(row("o-2")["reason"], "waiting for version 1");
    let o = cli(with(base("held"), &["--aggregate-id", "o-2"]));
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.contains("order \"o-2\" v2") && out.contains("waiting for version 1"),
        "{out}"
    );

    // A dry run changes nothing; a skip without a reason is refused by the CLI.
    let target = ["--aggregate-type", "order", "--aggregate-id", "o-1"];
    let o = cli(with(
        base("skip"),
        &[&target[..], &["--dry-run", "--reason", "x"]].concat(),
    ));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("would be order \"o-1\": skipped to version 2 (was 1)"),
        "{}",
        text(&o)
    );
    assert!(audited(&db, "consumer_skip").await.is_empty());
    let o = cli(with(base("skip"), &target));
    assert!(!o.status.success());
    assert!(text(&o).contains("--reason"), "{}", text(&o));

    // The skip and the seed, audited.
    let o = cli(with(
        base("skip"),
        &[
            &target[..],
            &["--reason", "the relay skipped v2", "--actor", "ops"],
        ]
        .concat(),
    ));
    assert!(o.status.success(), "{}", text(&o));
    let o = cli(with(
        base("seed"),
        &["--from-held", "--reason", "joined late"],
    ));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("order \"o-2\": seeded version 1 (was -)"),
        "{}",
        text(&o)
    );
    let skips = audited(&db, "consumer_skip").await;
    assert_eq!(skips.len(), 1);
    assert_eq!(
        (skips[0].0.as_str(), skips[0].1.as_str()),
        ("ops", "the relay skipped v2")
    );
    assert_eq!(skips[0].2["aggregates"][0]["from"], 1);
    assert_eq!(skips[0].2["aggregates"][0]["to"], 2);
    assert_eq!(audited(&db, "consumer_seed").await.len(), 1);

    // Never back.
    let o = cli(with(
        base("seed"),
        &[&target[..], &["--version", "1", "--reason", "oops"]].concat(),
    ));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("never moves an aggregate back"),
        "{}",
        text(&o)
    );

    // The runner's sweep applies what was released, in order.
    let config = ConsumerConfig::new("billing");
    while processor.apply_due(&config, &NoDeadLetters).await.unwrap() {}
    assert_eq!(applied(&db, "o-1").await, [1, 3, 4]);
    assert_eq!(applied(&db, "o-2").await, [2, 3]);
    let o = cli(with(base("list"), &["--held", "--json"]));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap(),
        serde_json::json!([])
    );
}
