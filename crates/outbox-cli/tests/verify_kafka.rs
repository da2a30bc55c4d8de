//! `outbox verify` on Kafka (tansu, `scripts/tools/kafka.sh`; `OUTBOX_TEST_KAFKA_BROKERS`
//! overrides it): every partition of a topic the relay filled is read to its end without
//! committing anything; tampering with the topic is named, and messages with no row are
//! judged by their aggregate versions.
#![cfg(feature = "kafka")]

mod support;

use std::time::Duration;

use outbox::{Event, Outbox};
use outbox_testkit::{database_url, insert_sequences, unique, wait_until, TestDb};
use rdkafka::{
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    message::{Header, OwnedHeaders},
    producer::{FutureProducer, FutureRecord},
    ClientConfig,
};
use support::{fast_config, run, RelayProcess};

const WAIT: Duration = Duration::from_secs(60);

fn brokers() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Produces one message to `partition` of `topic` with the outbox's headers.
async fn produce(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    event_id: &str,
    aggregate: &str,
    version: Option<i64>,
) {
    let version = version.map(|v| v.to_string());
    let mut headers = OwnedHeaders::new()
        .insert(Header {
            key: "event-id",
            value: Some(event_id),
        })
        .insert(Header {
            key: "aggregate-type",
            value: Some("order"),
        })
        .insert(Header {
            key: "aggregate-id",
            value: Some(aggregate),
        });
    if let Some(version) = &version {
        headers = headers.insert(Header {
            key: "aggregate-version",
            value: Some(version.as_str()),
        });
    }
    producer
        .send(
            FutureRecord::to(topic)
                .partition(partition)
                .key(aggregate)
                .payload("{}")
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .expect("produce");
}

#[tokio::test]
async fn a_kafka_topic_verifies_clean_and_a_tampered_one_names_each_problem() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let topic = format!("{prefix}.order.Happened");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let written = insert_sequences(&db, "order", 10, 5, 50).await;
    let config = fast_config(&prefix, "");
    let relay = RelayProcess::start(
        &db,
        &format!("kafka://{}", brokers()),
        &config,
        "127.0.0.1:0",
    );
    wait_until("the outbox to drain", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
    drop(relay);
    let _ = std::fs::remove_file(config);

    let url = database_url();
    let kafka_url = format!("kafka://{}", brokers());
    let verify = |extra: &[&str]| {
        let mut args = vec![
            "verify",
            "--database-url",
            &url,
            "--schema",
            &db.schema,
            "--broker-url",
            &kafka_url,
            "--topic",
            &topic,
        ];
        args.extend(extra);
        run(&args)
    };
    // A topic named twice is read once.
    let o = verify(&["--topic", &topic]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains(&format!(
            "outbox events in window: {written} ({written} published"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("broker messages read:    {written}\n")),
        "{text}"
    );
    assert!(text.ends_with("clean\n"), "{text}");

    // Tamper: a published event the topic lacks, an aggregate whose second event reached its
    // partition before its first, a second copy of a message, and events with no row whose
    // versions go 1, 3, 2.
    let outbox = db.outbox();
    let mut tx = db.pool.begin().await.unwrap();
    let lost = outbox
        .enqueue(&mut tx, &Event::new("order", "lost", "Happened"))
        .await
        .unwrap();
    let z1 = outbox
        .enqueue(&mut tx, &Event::new("order", "z", "Happened"))
        .await
        .unwrap();
    let z2 = outbox
        .enqueue(&mut tx, &Event::new("order", "z", "Happened"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    db.exec(
        "UPDATE {schema}.{events} SET status = 'published', published_at = now()
         WHERE status = 'pending'",
    )
    .await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    produce(&producer, &topic, 1, &z2.to_string(), "z", None).await;
    produce(&producer, &topic, 1, &z1.to_string(), "z", None).await;
    produce(&producer, &topic, 1, &z1.to_string(), "z", None).await;
    for (n, version) in [(1, 1), (2, 3), (3, 2)] {
        let id = format!("0190a0b0-0000-7000-8000-00000000000{n}");
        produce(&producer, &topic, 2, &id, "w", Some(version)).await;
    }

    let o = verify(&["--json"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        doc["missing"],
        serde_json::json!([lost.to_string()]),
        "{doc}"
    );
    assert_eq!(
        doc["order_violations"],
        serde_json::json!([z1.to_string()]),
        "{doc}"
    );
    assert_eq!(doc["duplicates"], 1, "{doc}");
    assert_eq!(doc["not_in_table"], 3, "{doc}");
    assert_eq!(doc["version_gaps"], 1, "{doc}");
    assert_eq!(doc["version_regressions"], 1, "{doc}");
    assert_eq!(doc["broker_messages"], written + 6, "{doc}");
    assert_eq!(doc["clean"], false, "{doc}");

    // A topic that does not exist, and Kafka without a topic, are named.
    let o = run(&[
        "verify",
        "--database-url",
        &url,
        "--schema",
        &db.schema,
        "--broker-url",
        &kafka_url,
    ]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--topic is required"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = verify(&["--topic", &unique("absent")]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no topic"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = admin
        .delete_topics(&[topic.as_str()], &AdminOptions::new())
        .await;
}
