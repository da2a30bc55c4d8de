//! `outbox migrate --cdc` and `outbox relay --mode cdc` as processes, on the private
//! `wal_level = logical` PostgreSQL: set-up, three relays with one streaming, SIGKILL of the
//! streamer mid-stream, clear errors.

mod support;

use std::time::Duration;

use outbox::postgres::MigrateOptions;
use outbox_testkit::{
    cdc_database_url, database_url, insert_sequences, unique, wait_until, RabbitReader, Report,
    TestDb, RABBITMQ_URL,
};
use support::{fast_config, run, RelayProcess};

const WAIT: Duration = Duration::from_secs(120);

fn migrate_cdc(db: &TestDb, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["migrate", "--database-url", &db.url, "--schema", &db.schema];
    args.extend_from_slice(extra);
    run(&args)
}

#[tokio::test]
async fn three_cdc_relays_survive_a_sigkill_of_the_streamer() {
    let db = TestDb::on(
        &cdc_database_url(),
        MigrateOptions {
            partitions: Some(8),
            ..Default::default()
        },
    )
    .await;
    let out = migrate_cdc(&db, &["--cdc"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("created"), "{text}");
    let again = migrate_cdc(&db, &["--cdc"]);
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("exists"),
        "idempotent"
    );

    let prefix = unique("p");
    let exchange = unique("x");
    // RabbitMQ has no broker-side dedupe: every duplicate the crash causes is visible here.
    let reader = RabbitReader::start(&exchange, "#").await;
    let config = fast_config(&prefix, &format!("[rabbitmq]\nexchange = \"{exchange}\""));
    let start = |i: usize| {
        let id = format!("cdc-{i}");
        RelayProcess::start_with_env(
            &db,
            RABBITMQ_URL,
            &config,
            "127.0.0.1:0",
            &[
                ("OUTBOX_RELAY__MODE", "cdc"),
                ("OUTBOX_RELAY__RELAY_ID", &id),
            ],
        )
    };
    let mut relays: Vec<RelayProcess> = (0..3).map(start).collect();
    let writer = {
        let db = TestDb::adopt(db.pool.clone(), db.tables.clone());
        tokio::spawn(async move { insert_sequences(&db, "account", 200, 20, 100).await })
    };
    wait_until("a third of the events", WAIT, || {
        let n = reader.deliveries().len();
        async move { n >= 1_300 }
    })
    .await;
    let streamer: String = sqlx::query_scalar(
        &db.tables
            .render("SELECT owner FROM {schema}.leases WHERE owner IS NOT NULL LIMIT 1"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let victim: usize = streamer.trim_start_matches("cdc-").parse().unwrap();
    relays[victim].kill();
    relays[victim] = start(victim);
    let written = writer.await.unwrap();
    wait_until("every event to be delivered", WAIT, || {
        let report = Report::of(&reader.deliveries());
        async move { report.unique >= written }
    })
    .await;
    wait_until("every row to be marked published", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
    for relay in &mut relays {
        assert!(relay.terminate(), "clean exit on SIGTERM:\n{}", relay.log());
    }
    let report = Report::of(&reader.deliveries());
    eprintln!("cdc, three processes, streamer {streamer} killed: {written} written, {report:?}");
    assert_eq!(report.unique, written, "nothing lost");
    assert_eq!(report.order_violations, 0);
    let status = run(&["status", "--database-url", &db.url, "--schema", &db.schema]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&format!("cdc slot {}_events", db.schema)) && text.contains("not streamed"),
        "{text}"
    );
    let dropped = migrate_cdc(&db, &["--drop-cdc"]);
    assert!(
        dropped.status.success(),
        "{}",
        String::from_utf8_lossy(&dropped.stderr)
    );
    let slots: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1")
            .bind(format!("{}_events", db.schema))
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(slots, 0, "--drop-cdc removes the slot");
    reader.cleanup().await;
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn cdc_on_a_server_without_logical_decoding_is_a_clear_error() {
    let db = TestDb::new(2).await;
    let url = database_url();
    let wal_level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    if wal_level == "logical" {
        eprintln!("the shared server has wal_level = logical: nothing to check");
        return;
    }
    let out = run(&[
        "migrate",
        "--database-url",
        &url,
        "--schema",
        &db.schema,
        "--cdc",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("wal_level is 'replica'") && err.contains("ALTER SYSTEM"),
        "{err}"
    );
    let out = run(&[
        "relay",
        "--database-url",
        &url,
        "--schema",
        &db.schema,
        "--broker-url",
        "nats://127.0.0.1:4222",
        "--mode",
        "cdc",
        "--listen",
        "127.0.0.1:0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("logical replication needs 'logical'"), "{err}");
}
