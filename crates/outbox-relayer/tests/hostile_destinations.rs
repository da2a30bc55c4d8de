//! Event data steering the relay: rows inserted by SQL (the table is a public contract, any
//! writer may insert) whose destination, routed subject or headers name something of the
//! broker's own. Each is refused before anything is sent and dead-lettered with a reason that
//! names the destination and the rule, or loses the forged headers, and the other aggregates
//! keep flowing. Checked from outside: the broker's own state, what a reader receives, and the
//! rows' status and `last_error`.

mod common;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use outbox_relayer::{
    publishers::{
        mqtt::{MqttConfig, MqttPublisher},
        redis::{RedisConfig, RedisPublisher},
    },
    routing::RoutingConfig,
    Publisher, RelayConfig,
};
use outbox_testkit::{unique, wait_until, NatsReader, RabbitReader, TestDb, NATS_URL, REDIS_URL};
use serde_json::json;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// Inserts one event as a writer would with plain SQL; returns its row id.
async fn insert(
    db: &TestDb,
    (aggregate_type, aggregate_id, event_type): (&str, &str, &str),
    destination: Option<&str>,
    headers: serde_json::Value,
) -> i64 {
    let sql = db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
         destination, payload, content_type, headers) VALUES ($1, $2, $3, $4, $5, $6, \
         'application/json', $7::text::jsonb) RETURNING id",
    );
    sqlx::query_scalar(&sql)
        .bind(Uuid::now_v7())
        .bind(aggregate_type)
        .bind(aggregate_id)
        .bind(event_type)
        .bind(destination)
        .bind(&b"{}"[..])
        .bind(headers.to_string())
        .fetch_one(&db.pool)
        .await
        .expect("insert")
}

/// The status and last error of row `id`.
async fn row(db: &TestDb, id: i64) -> (String, Option<String>) {
    sqlx::query_as(
        &db.tables
            .render("SELECT status, last_error FROM {schema}.{events} WHERE id = $1"),
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .expect("row")
}

/// Waits until row `id` is dead, and returns its last error.
async fn dead_letter(db: &TestDb, id: i64) -> String {
    wait_until(&format!("row {id} to be dead"), WAIT, || async {
        row(db, id).await.0 == "dead"
    })
    .await;
    row(db, id).await.1.expect("a dead letter keeps its reason")
}

/// The relay's default routing (`{aggregate_type}.{event_type}`), which event data fills.
fn default_routing(db: &TestDb) -> RelayConfig {
    RelayConfig {
        routing: RoutingConfig::default(),
        ..common::fast_config(db, "unused")
    }
}

/// A row naming a JetStream API subject, by its destination or through the default routing
/// template, never reaches the server: the stream it names keeps its messages, no request
/// arrives on its API subjects, the rows are dead letters naming the subject and the rule,
/// and an ordinary event is published. Before: the stream was deleted and the row marked
/// published.
#[tokio::test]
async fn jetstream_api_and_inbox_subjects_are_dead_letters_and_the_stream_survives() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let client = async_nats::connect(NATS_URL).await.unwrap();
    let js = jetstream::new(client.clone());
    let victim = unique("victim");
    js.create_stream(stream::Config {
        name: victim.clone(),
        subjects: vec![format!("{victim}.>")],
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish(format!("{victim}.kept"), "kept".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let mut deletes = client
        .subscribe(format!("$JS.API.STREAM.DELETE.{victim}"))
        .await
        .unwrap();
    let mut purges = client
        .subscribe(format!("$JS.API.STREAM.PURGE.{victim}"))
        .await
        .unwrap();
    client.flush().await.unwrap();

    let delete = format!("$JS.API.STREAM.DELETE.{victim}");
    let by_destination = insert(&db, ("order", "d1", "Placed"), Some(&delete), json!({})).await;
    let purge = format!("API.STREAM.PURGE.{victim}");
    let by_template = insert(&db, ("$JS", "d2", &purge), None, json!({})).await;
    let inbox = insert(
        &db,
        ("order", "d3", "Placed"),
        Some("_INBOX.x.1"),
        json!({}),
    )
    .await;
    let fine = format!("{prefix}.order.Placed");
    let ok = insert(&db, ("order", "ok", "Placed"), Some(&fine), json!({})).await;

    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        default_routing(&db),
    )
    .await;
    reader.wait_for(1, WAIT).await;
    let reasons = [
        (dead_letter(&db, by_destination).await, delete),
        (dead_letter(&db, by_template).await, format!("$JS.{purge}")),
        (dead_letter(&db, inbox).await, "_INBOX.x.1".to_owned()),
    ];
    relay.shutdown().await.unwrap();

    for (reason, subject) in &reasons {
        assert!(reason.contains(&format!("{subject:?}")), "{reason}");
        assert!(reason.contains("refused"), "{reason}");
    }
    assert_eq!(row(&db, ok).await.0, "published");
    let info = js
        .get_stream(&victim)
        .await
        .expect("the stream survives")
        .info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(info, 1, "the stream keeps its message");
    client.flush().await.unwrap();
    for api in [&mut deletes, &mut purges] {
        let seen = futures::FutureExt::now_or_never(api.next());
        assert!(seen.is_none(), "a request reached the API: {seen:?}");
    }
    js.delete_stream(&victim).await.unwrap();
    reader.cleanup().await;
}

/// A reply that is not a JetStream PubAck, from a core-NATS service answering on the subject,
/// does not mark the event published: it is a dead letter saying so. Before: any reply
/// without an `error` field (`{"ok":true}`), or one starting with a `stream` key and no
/// sequence, counted as the acknowledgement.
#[tokio::test]
async fn a_reply_that_is_not_a_pub_ack_is_a_dead_letter_not_a_publish() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let client = async_nats::connect(NATS_URL).await.unwrap();
    let service = unique("svc");
    let mut requests = client.subscribe(format!("{service}.>")).await.unwrap();
    let responder = {
        let client = client.clone();
        tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                let answer = match request.subject.ends_with("plain") {
                    true => r#"{"ok":true}"#,
                    false => r#"{"stream":"FAKE"}"#,
                };
                if let Some(reply) = request.reply {
                    client.publish(reply, answer.into()).await.unwrap();
                }
            }
        })
    };
    client.flush().await.unwrap();

    let plain = format!("{service}.plain");
    let answered = insert(&db, ("order", "s1", "Placed"), Some(&plain), json!({})).await;
    let half = format!("{service}.half");
    let half_ack = insert(&db, ("order", "s2", "Placed"), Some(&half), json!({})).await;
    let fine = format!("{prefix}.order.Placed");
    let ok = insert(&db, ("order", "ok", "Placed"), Some(&fine), json!({})).await;

    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    let reasons = [
        (dead_letter(&db, answered).await, plain),
        (dead_letter(&db, half_ack).await, half),
    ];
    reader.wait_for(1, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    responder.abort();

    for (reason, subject) in &reasons {
        assert!(reason.contains(&format!("{subject:?}")), "{reason}");
        assert!(
            reason.contains("not a JetStream acknowledgement"),
            "{reason}"
        );
    }
    assert_eq!(row(&db, ok).await.0, "published");
    reader.cleanup().await;
}

/// The forged headers of a row, and what each relay header must be once on the message.
fn forged_headers() -> serde_json::Value {
    json!({
        "Event-Id": "forged",
        "EVENT-TYPE": "Forged",
        "Aggregate-Id": "victim",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    })
}

/// Asserts that each relay header is on the message once (names compared in any case) with
/// the relay's value, and that the writer's own header is kept.
fn assert_relay_headers_once(headers: &BTreeMap<String, String>, event_id: &str) {
    for (name, wanted) in [
        ("event-id", event_id),
        ("event-type", "Placed"),
        ("aggregate-id", "a1"),
    ] {
        let found: Vec<_> = headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .collect();
        assert_eq!(found.len(), 1, "{name} once: {headers:?}");
        assert_eq!(found[0].1, wanted, "{name}: {headers:?}");
    }
    assert!(headers["traceparent"].starts_with("00-4bf9"), "{headers:?}");
}

/// The event id of row `id`.
async fn event_id(db: &TestDb, id: i64) -> String {
    let sql = db
        .tables
        .render("SELECT event_id::text FROM {schema}.{events} WHERE id = $1");
    sqlx::query_scalar(&sql)
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// Writer headers named like the relay's, in another case, never reach a NATS consumer: each
/// relay header arrives once with the relay's value; `Nats-` headers, which JetStream acts on,
/// are dropped. Before: `Event-Id: forged` arrived beside the real `event-id`.
#[tokio::test]
async fn forged_relay_headers_never_reach_nats() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let mut headers = forged_headers();
    headers["Nats-Expected-Stream"] = json!("NOT_THIS_ONE");
    let destination = format!("{prefix}.order.Placed");
    let id = insert(&db, ("order", "a1", "Placed"), Some(&destination), headers).await;
    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    let got = reader.wait_for(1, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();

    assert_relay_headers_once(&got[0].headers, &event_id(&db, id).await);
    assert!(
        !got[0]
            .headers
            .keys()
            .any(|k| k.eq_ignore_ascii_case("nats-expected-stream")),
        "{:?}",
        got[0].headers
    );
    reader.cleanup().await;
}

/// The same on RabbitMQ, whose header table keys are case-sensitive.
#[tokio::test]
async fn forged_relay_headers_never_reach_rabbitmq() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let exchange = unique("x");
    let reader = RabbitReader::start(&exchange, "#").await;
    let destination = format!("{prefix}.order.Placed");
    let id = insert(
        &db,
        ("order", "a1", "Placed"),
        Some(&destination),
        forged_headers(),
    )
    .await;
    let relay = common::start(
        &db,
        common::rabbitmq(&exchange).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    let got = reader.wait_for(1, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();

    assert_relay_headers_once(&got[0].headers, &event_id(&db, id).await);
    reader.cleanup().await;
}

/// Runs a relay over `publisher` on rows naming `refused` destinations and one `fine` one;
/// each refused row is a dead letter naming its destination and `rule`.
async fn refused_on(publisher: Arc<dyn Publisher>, refused: &[&str], fine: &str, rule: &str) {
    let db = TestDb::new(4).await;
    let mut rows = Vec::new();
    for (i, destination) in refused.iter().enumerate() {
        let aggregate = format!("r{i}");
        let id = insert(
            &db,
            ("order", &aggregate, "Placed"),
            Some(destination),
            json!({}),
        )
        .await;
        rows.push((id, destination));
    }
    let ok = insert(&db, ("order", "ok", "Placed"), Some(fine), json!({})).await;
    let relay = common::start(&db, publisher, common::fast_config(&db, "unused")).await;
    for (id, destination) in rows {
        let reason = dead_letter(&db, id).await;
        assert!(reason.contains(&format!("{destination:?}")), "{reason}");
        assert!(reason.contains(rule), "{reason}");
    }
    wait_until("the fine event to be published", WAIT, || async {
        row(&db, ok).await.0 == "published"
    })
    .await;
    relay.shutdown().await.unwrap();
}

/// MQTT: `$SYS` topics are the broker's. Before: published (or dropped by the broker for
/// want of subscribers, with another reason).
#[tokio::test]
async fn mqtt_system_topics_are_dead_letters() {
    let topic = unique("shop");
    let publisher = MqttPublisher::connect(MqttConfig {
        require_subscribers: false,
        ..Default::default()
    })
    .expect("mqtt publisher");
    refused_on(
        Arc::new(publisher),
        &["$SYS/broker/clients/total", "$share/g/orders"],
        &format!("{topic}/orders"),
        "refused",
    )
    .await;
}

/// Redis: a stream key in the relay's own dedupe namespace. Before: the entry was added there.
#[tokio::test]
async fn redis_keys_of_the_relay_are_dead_letters() {
    let key = unique("events");
    let relay_key = format!("{{{key}}}:outbox-dedupe:{}", Uuid::now_v7());
    let publisher = RedisPublisher::connect(RedisConfig {
        url: REDIS_URL.into(),
        ..Default::default()
    })
    .expect("redis publisher");
    refused_on(Arc::new(publisher), &[&relay_key], &key, "dedupe").await;
    let client = redis::Client::open(REDIS_URL).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg(&relay_key)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(!exists, "nothing was written at {relay_key}");
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut connection)
        .await
        .unwrap();
}
