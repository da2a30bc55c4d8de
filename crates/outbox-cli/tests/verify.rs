//! `outbox verify` proves G1 and G4 against what the broker holds, and catches tampering.

mod support;

use std::time::Duration;

use async_nats::{jetstream, HeaderMap};
use outbox::{Event, Outbox};
use outbox_testkit::{
    database_url, insert_sequences, unique, wait_until, NatsReader, RabbitReader, TestDb, NATS_URL,
    RABBITMQ_URL,
};
use support::{fast_config, run, RelayProcess};

const WAIT: Duration = Duration::from_secs(60);

async fn relay_until_drained(db: &TestDb, broker: &str, extra: &str, prefix: &str) {
    relay_with_env_until_drained(db, broker, extra, prefix, &[]).await;
}

async fn relay_with_env_until_drained(
    db: &TestDb,
    broker: &str,
    extra: &str,
    prefix: &str,
    env: &[(&str, &str)],
) {
    let config = fast_config(prefix, extra);
    let relay = RelayProcess::start_with_env(db, broker, &config, "127.0.0.1:0", env);
    wait_until("the outbox to drain", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
    drop(relay);
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn a_clean_stream_verifies_and_a_tampered_one_names_each_problem() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let stream = unique("S");
    let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
    let written = insert_sequences(&db, "order", 10, 10, 50).await;
    relay_until_drained(
        &db,
        NATS_URL,
        &format!("[nats]\nstream = \"{stream}\""),
        &prefix,
    )
    .await;
    reader.wait_for(written, WAIT).await;
    let url = database_url();
    let verify = |extra: &[&str]| {
        let mut args = vec![
            "verify",
            "--database-url",
            &url,
            "--schema",
            &db.schema,
            "--broker-url",
            NATS_URL,
            "--stream",
            &stream,
        ];
        args.extend(extra);
        run(&args)
    };
    let o = verify(&[]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains("outbox events in window: 100 (100 published)"),
        "{text}"
    );
    assert!(text.ends_with("clean\n"), "{text}");

    // Tamper: a published event that never reached the broker (loss), a message delivered
    // twice (duplicate), and an aggregate whose second event arrived before its first (order).
    let outbox = db.outbox();
    let mut tx = db.pool.begin().await.unwrap();
    let lost = outbox
        .enqueue(&mut tx, &Event::new("order", "lost", "Placed"))
        .await
        .unwrap();
    let z1 = outbox
        .enqueue(&mut tx, &Event::new("order", "z", "Placed"))
        .await
        .unwrap();
    let z2 = outbox
        .enqueue(&mut tx, &Event::new("order", "z", "Paid"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    db.exec("UPDATE {schema}.{events} SET status = 'published', published_at = now() WHERE status = 'pending'")
        .await;
    let js = jetstream::new(async_nats::connect(NATS_URL).await.unwrap());
    let send = |id: uuid::Uuid, aggregate: &'static str| {
        let js = js.clone();
        let subject = format!("{prefix}.order.Placed");
        async move {
            let mut h = HeaderMap::new();
            h.insert("event-id", id.to_string().as_str());
            h.insert("aggregate-type", "order");
            h.insert("aggregate-id", aggregate);
            js.publish_with_headers(subject, h, "{}".into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    send(z2, "z").await;
    send(z1, "z").await;
    // A fan-out copy of the lost event does not stand for it.
    let mut h = HeaderMap::new();
    h.insert("event-id", lost.to_string().as_str());
    h.insert("copy-of-schema-version", "2");
    js.publish_with_headers(format!("{prefix}.payments.v1"), h, "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let first = reader.deliveries()[0].event_id.parse().unwrap();
    send(first, "a0").await;
    let o = verify(&["--json"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["missing"], serde_json::json!([lost.to_string()]));
    assert_eq!(doc["order_violations"], serde_json::json!([z1.to_string()]));
    assert_eq!(doc["duplicates"], 1);
    assert_eq!(doc["fan_out_copies"], 1);
    let o = verify(&[
        "--since",
        "2030-01-01T00:00:00Z",
        "--until",
        "2029-01-01T00:00:00Z",
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("must be before --until"));
    reader.cleanup().await;
}

#[tokio::test]
async fn a_rabbitmq_audit_queue_verifies_clean() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let exchange = unique("x");
    let audit = RabbitReader::declare_only(&exchange, "#").await;
    let written = insert_sequences(&db, "order", 5, 4, 20).await;
    relay_until_drained(
        &db,
        RABBITMQ_URL,
        &format!("[rabbitmq]\nexchange = \"{exchange}\""),
        &prefix,
    )
    .await;
    let url = database_url();
    let o = run(&[
        "verify",
        "--database-url",
        &url,
        "--schema",
        &db.schema,
        "--broker-url",
        RABBITMQ_URL,
        "--queue",
        &audit.queue,
    ]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains(&format!("broker messages read:    {written}")),
        "{text}"
    );
    let o = run(&[
        "verify",
        "--database-url",
        &url,
        "--schema",
        &db.schema,
        "--broker-url",
        RABBITMQ_URL,
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--queue is required"));
    audit.cleanup().await;
}

/// Events sent in either CloudEvents envelope are recognised by their attributes (binary: the
/// `ce-` headers; structured: the JSON body), not taken for foreign messages.
#[tokio::test]
async fn cloudevents_envelopes_verify_clean() {
    for envelope in ["cloudevents-binary", "cloudevents-structured"] {
        let db = TestDb::new(4).await;
        let prefix = unique("p");
        let stream = unique("S");
        let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
        let written = insert_sequences(&db, "order", 4, 5, 20).await;
        relay_with_env_until_drained(
            &db,
            NATS_URL,
            &format!("[nats]\nstream = \"{stream}\""),
            &prefix,
            &[("OUTBOX_RELAY__ENVELOPE", envelope)],
        )
        .await;
        let url = database_url();
        let o = run(&[
            "verify",
            "--database-url",
            &url,
            "--schema",
            &db.schema,
            "--broker-url",
            NATS_URL,
            "--stream",
            &stream,
            "--json",
        ]);
        assert!(
            o.status.success(),
            "{envelope}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(doc["published"], written, "{envelope}: {doc}");
        assert_eq!(doc["missing_count"], 0, "{envelope}: {doc}");
        assert_eq!(doc["not_an_outbox_message"], 0, "{envelope}: {doc}");
        reader.cleanup().await;
    }
}
