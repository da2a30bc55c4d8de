//! `outbox relay` against Redis Streams and MQTT, as a user runs it: only the broker URL and a
//! config file. The Redis run kills the relay mid-way; the publisher's event-id dedupe must
//! absorb the re-publishes the crash causes.

mod support;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use outbox_testkit::{insert_sequences, unique, wait_until, Delivery, Report, TestDb};
use redis::AsyncCommands;
use rumqttc::v5::{
    mqttbytes::{v5::Packet, QoS},
    AsyncClient, Event, MqttOptions,
};
use support::{fast_config, RelayProcess};

const WAIT: Duration = Duration::from_secs(120);
const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// Every entry of the streams `{prefix}:*`, decoded.
async fn stream_entries(
    connection: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> Vec<Delivery> {
    let keys: Vec<String> = connection.keys(format!("{prefix}:*")).await.expect("KEYS");
    let mut out = Vec::new();
    for key in keys {
        let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
            .arg(&key)
            .arg("-")
            .arg("+")
            .query_async(connection)
            .await
            .expect("XRANGE");
        for (_, fields) in entries {
            let mut headers = BTreeMap::new();
            let mut payload = Vec::new();
            for pair in fields.chunks(2) {
                let name = String::from_utf8_lossy(&pair[0]).into_owned();
                if name == "payload" {
                    payload = pair[1].clone();
                } else {
                    headers.insert(name, String::from_utf8_lossy(&pair[1]).into_owned());
                }
            }
            out.push(Delivery::from_headers(key.clone(), headers, payload));
        }
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
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut options = MqttOptions::new(unique("reader"), "127.0.0.1", 1883);
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut event_loop) = AsyncClient::new(options, 16);
    client
        .subscribe(format!("{prefix}/#"), QoS::AtLeastOnce)
        .await
        .unwrap();
    loop {
        if let Event::Incoming(Packet::SubAck(_)) = event_loop.poll().await.expect("mqtt") {
            break;
        }
    }
    let sink = seen.clone();
    let reader = tokio::spawn(async move {
        while let Ok(event) = event_loop.poll().await {
            if let Event::Incoming(Packet::Publish(p)) = event {
                let headers: BTreeMap<String, String> = p
                    .properties
                    .iter()
                    .flat_map(|p| p.user_properties.iter().cloned())
                    .collect();
                sink.lock().unwrap().push(Delivery::from_headers(
                    String::from_utf8_lossy(&p.topic).into_owned(),
                    headers,
                    p.payload.to_vec(),
                ));
            }
        }
    });
    let written = insert_sequences(&db, "device", 40, 10, 100).await;
    let config = fast_config(&prefix, "");
    let routing = std::fs::read_to_string(&config).unwrap().replace(
        &format!("{prefix}.{{aggregate_type}}.{{event_type}}"),
        &format!("{prefix}/{{aggregate_type}}/{{event_type}}"),
    );
    std::fs::write(&config, routing).unwrap();
    let mut relay = RelayProcess::start(&db, "mqtt://127.0.0.1:1883", &config, "127.0.0.1:0");
    wait_until("every event at the subscriber", WAIT, || {
        let n = Report::of(&seen.lock().unwrap()).unique;
        async move { n >= written }
    })
    .await;
    wait_until("the outbox to drain", WAIT, || async {
        db.count("pending").await == 0
    })
    .await;
    assert!(relay.terminate(), "clean exit:\n{}", relay.log());
    let report = Report::of(&seen.lock().unwrap());
    println!("mqtt: {written} written, {report:?}");
    assert_eq!(report.unique, written);
    assert_eq!(report.order_violations, 0);
    reader.abort();
    let _ = std::fs::remove_file(config);
}
