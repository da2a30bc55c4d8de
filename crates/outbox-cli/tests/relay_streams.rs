//! `outbox relay` against Redis Streams and MQTT, as a user runs it: only the broker URL and a
//! config file. The Redis run kills the relay mid-way; the publisher's event-id dedupe must
//! absorb the re-publishes the crash causes.

mod support;

use std::time::Duration;

use outbox_testkit::{
    insert_sequences, stream_deliveries, unique, wait_until, Delivery, MqttReader, Report, TestDb,
    REDIS_URL,
};
use redis::AsyncCommands;
use support::{fast_config, RelayProcess};

const WAIT: Duration = Duration::from_secs(120);

/// Every entry of the streams `{prefix}:*`, decoded.
async fn stream_entries(
    connection: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> Vec<Delivery> {
    let keys: Vec<String> = connection.keys(format!("{prefix}:*")).await.expect("KEYS");
    let mut out = Vec::new();
    for key in keys {
        out.extend(stream_deliveries(connection, &key).await);
    }
    out
}

#[tokio::test]
async fn redis_streams_get_every_event_once_in_order_across_a_relay_crash() {
    let db = TestDb::new(8).await;
    let prefix = unique("rs");
    let written = insert_sequences(&db, "order", 100, 30, 500).await;
    let config = fast_config(&prefix, "");
    // Streams per aggregate type: `{prefix}:order`.
    let routing = std::fs::read_to_string(&config).unwrap().replace(
        &format!("{prefix}.{{aggregate_type}}.{{event_type}}"),
        &format!("{prefix}:{{aggregate_type}}"),
    );
    std::fs::write(&config, routing).unwrap();

    let mut relay = RelayProcess::start(&db, REDIS_URL, &config, "127.0.0.1:0");
    wait_until("the relay to be mid-way", WAIT, || async {
        db.count("published").await >= 1_000
    })
    .await;
    relay.kill();
    let mut restarted = RelayProcess::start(&db, REDIS_URL, &config, "127.0.0.1:0");
    wait_until("the outbox to drain", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
    assert!(restarted.terminate(), "clean exit:\n{}", restarted.log());

    let client = redis::Client::open(REDIS_URL).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let entries = stream_entries(&mut connection, &prefix).await;
    let report = Report::of(&entries);
    println!("redis streams, kill -9 mid-way: {written} written, {report:?}");
    assert_eq!(report.unique, written, "nothing lost");
    assert_eq!(
        report.duplicates, 0,
        "re-publishes after the crash are deduped by event id"
    );
    assert_eq!(report.order_violations, 0);
    let keys: Vec<String> = connection.keys(format!("*{prefix}*")).await.unwrap();
    let _: () = connection.del(keys).await.unwrap();
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn mqtt_subscribers_get_every_event_in_order() {
    let db = TestDb::new(4).await;
    let prefix = unique("mq");
    // The subscriber must exist first: MQTT keeps nothing for absent subscribers.
    let reader = MqttReader::try_start(1883, &format!("{prefix}/#"))
        .await
        .expect("mqtt reader");
    let written = insert_sequences(&db, "device", 40, 10, 100).await;
    let config = fast_config(&prefix, "");
    let routing = std::fs::read_to_string(&config).unwrap().replace(
        &format!("{prefix}.{{aggregate_type}}.{{event_type}}"),
        &format!("{prefix}/{{aggregate_type}}/{{event_type}}"),
    );
    std::fs::write(&config, routing).unwrap();
    let mut relay = RelayProcess::start(&db, "mqtt://127.0.0.1:1883", &config, "127.0.0.1:0");
    wait_until("every event at the subscriber", WAIT, || {
        let n = Report::of(&reader.deliveries()).unique;
        async move { n >= written }
    })
    .await;
    wait_until("the outbox to drain", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
    assert!(relay.terminate(), "clean exit:\n{}", relay.log());
    let report = Report::of(&reader.deliveries());
    println!("mqtt: {written} written, {report:?}");
    assert_eq!(report.unique, written);
    assert_eq!(report.order_violations, 0);
    reader.cleanup().await;
    let _ = std::fs::remove_file(config);
}
