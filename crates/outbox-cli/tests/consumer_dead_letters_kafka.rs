//! `outbox consumer-dead-letters list | replay` on Kafka (tansu, `scripts/tools/kafka.sh`;
//! `OUTBOX_TEST_KAFKA_BROKERS` overrides it): dead letters written as the Kafka runner writes
//! them (topic `{consumer}.dead`, origin and reason in headers), replayed to their original
//! topic with their key, marked replayed, and audited.
#![cfg(feature = "kafka")]

mod support;

use std::{collections::BTreeMap, time::Duration};

use outbox_testkit::{database_url, unique, TestDb};
use rdkafka::{
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{BaseConsumer, Consumer},
    message::{Header, Headers, Message as _, OwnedHeaders},
    producer::{FutureProducer, FutureRecord},
    ClientConfig, Offset, TopicPartitionList,
};
use support::run;

const POISON: &str = "0190a0b0-0000-7000-8000-000000000002";

fn brokers() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap()
}

struct Topics {
    consumer: String,
    origin: String,
    url: String,
}

impl Topics {
    /// The consumer's topic and its dead letters: one poison event, one malformed message.
    async fn new() -> Self {
        let consumer = unique("inventory");
        let origin = unique("orders");
        let dead = format!("{consumer}.dead");
        let created = admin()
            .create_topics(
                &[
                    NewTopic::new(&origin, 2, TopicReplication::Fixed(1)),
                    NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
                ],
                &AdminOptions::new(),
            )
            .await
            .unwrap();
        assert!(created.iter().all(Result::is_ok), "{created:?}");
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .create()
            .unwrap();
        for (event_id, reason) in [
            (Some(POISON), "cannot reserve: poison"),
            (None, "malformed message: no event-id header"),
        ] {
            let mut pairs = vec![
                ("dead-letter-reason", reason.to_owned()),
                ("dead-letter-attempts", "5".into()),
                ("dead-letter-topic", origin.clone()),
                ("dead-letter-partition", "1".into()),
                ("dead-letter-offset", "7".into()),
                ("dead-letter-consumer", consumer.clone()),
            ];
            if let Some(id) = event_id {
                pairs.insert(0, ("event-id", id.to_owned()));
                pairs.insert(1, ("event-type", "OrderPlaced".into()));
            }
            let mut headers = OwnedHeaders::new();
            for (key, value) in &pairs {
                headers = headers.insert(Header {
                    key,
                    value: Some(value),
                });
            }
            producer
                .send(
                    FutureRecord::to(&dead)
                        .key("o-1")
                        .payload("{\"qty\":1}")
                        .headers(headers),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
        }
        Self {
            consumer,
            origin,
            url: format!("kafka://{}", brokers()),
        }
    }

    fn args<'a>(&'a self, action: &'a str) -> Vec<&'a str> {
        vec![
            "consumer-dead-letters",
            action,
            "--broker-url",
            &self.url,
            "--consumer",
            &self.consumer,
        ]
    }

    /// The records of the origin topic: (key, headers).
    async fn origin_records(&self, n: usize) -> Vec<(String, BTreeMap<String, String>)> {
        let topic = self.origin.clone();
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", brokers())
                .set("group.id", unique("reader"))
                .create()
                .unwrap();
            let mut list = TopicPartitionList::new();
            for p in 0..2 {
                list.add_partition_offset(&topic, p, Offset::Beginning)
                    .unwrap();
            }
            consumer.assign(&list).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let mut out = Vec::new();
            while out.len() < n && std::time::Instant::now() < deadline {
                let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
                    continue;
                };
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                let v = h.value.unwrap_or_default();
                                (h.key.to_owned(), String::from_utf8_lossy(v).into_owned())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push((key, headers));
            }
            out
        })
        .await
        .unwrap()
    }

    async fn cleanup(self) {
        let dead = format!("{}.dead", self.consumer);
        let _ = admin()
            .delete_topics(&[&self.origin, &dead], &AdminOptions::new())
            .await;
    }
}

fn text(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test]
async fn lists_then_replays_a_dead_letter_to_its_topic_and_audits_it() {
    let db = TestDb::new(1).await;
    let t = Topics::new().await;
    let o = run(&[t.args("list"), vec!["--json"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{out}");
    assert_eq!(listed[0]["reason"], "cannot reserve: poison");
    assert_eq!(listed[0]["origin"], t.origin.as_str());
    assert_eq!(listed[1]["event_id"], serde_json::Value::Null);

    let url = database_url();
    let replay = [
        t.args("replay"),
        vec![
            "--reason-contains",
            "POISON",
            "--database-url",
            &url,
            "--schema",
            &db.schema,
            "--actor",
            "ops",
        ],
    ]
    .concat();
    let o = run(&replay);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with("replayed 1 dead letter(s) of"), "{out}");
    assert!(
        out.contains(&format!("kafka topic {}.dead", t.consumer)),
        "{out}"
    );
    // Back on the original topic, with its key and without the dead-letter headers.
    let records = t.origin_records(1).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].0, "o-1");
    assert_eq!(records[0].1["event-id"], POISON);
    assert!(!records[0].1.contains_key("dead-letter-reason"));
    // Marked replayed: only the malformed one is listed.
    let o = run(&[t.args("list"), vec!["--json"]].concat());
    let left: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(left.as_array().unwrap().len(), 1);
    assert_eq!(left[0]["event_id"], serde_json::Value::Null);
    let details: serde_json::Value = sqlx::query_scalar(
        &db.tables
            .render("SELECT details FROM {schema}.audit WHERE action = 'consumer_replay'"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(details["event_ids"][0], POISON);
    t.cleanup().await;
}

#[tokio::test]
async fn names_a_missing_dead_letter_topic() {
    let url = format!("kafka://{}", brokers());
    let consumer = unique("nobody");
    let o = run(&[
        "consumer-dead-letters",
        "list",
        "--broker-url",
        &url,
        "--consumer",
        &consumer,
    ]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(
        text(&o)
            .1
            .contains(&format!("no dead-letter topic {consumer}.dead")),
        "{:?}",
        text(&o)
    );
    let o = run(&["consumer-dead-letters", "list", "--broker-url", &url]);
    assert!(
        text(&o).1.contains("--consumer is required with kafka://"),
        "{:?}",
        text(&o)
    );
}

/// librdkafka properties reach the client (security settings go this way); a bad one is named,
/// its value never printed.
#[tokio::test]
async fn passes_kafka_properties_and_names_a_bad_one() {
    let t = Topics::new().await;
    let o = run(&[
        t.args("list"),
        vec!["--json", "--kafka-property", "client.id=ops-cli"],
    ]
    .concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    let o = run(&[
        t.args("list"),
        vec!["--kafka-property", "sasl.no.such.thing=hunter2"],
    ]
    .concat());
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("sasl.no.such.thing"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    let o = run(&[t.args("list"), vec!["--kafka-property", "hunter2"]].concat());
    let (_, err) = text(&o);
    assert!(err.contains("--kafka-property must be KEY=VALUE"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    t.cleanup().await;
}
