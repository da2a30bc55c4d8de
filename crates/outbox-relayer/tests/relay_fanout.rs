//! Fan-out during a schema migration, against real PostgreSQL and NATS JetStream: one stored
//! V2 event goes out as V2 and as a V1 copy; the row is marked published only after both are
//! acknowledged; order per aggregate holds on each destination.

mod common;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;
use outbox::{Event, Outbox};
use outbox_relayer::{
    fanout::{copy_message_id, FanOutCopy},
    routing::RouteRule,
    Message, PublishError, Publisher, RelayConfig,
};
use outbox_testkit::{unique, Delivery, NatsReader, Report, TestDb, NATS_URL};
use serde_json::{json, Value};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// The migration's rule: V2 to `…orders.v2`, plus a V1 copy without the fields V2 added.
fn migration_config(db: &TestDb, prefix: &str) -> RelayConfig {
    let mut config = common::fast_config(db, prefix);
    config.routing.rules.push(RouteRule {
        event_type: Some("OrderPlaced".into()),
        aggregate_type: None,
        destination: format!("{prefix}.orders.v{{schema_version}}"),
        fan_out: vec![FanOutCopy {
            destination: format!("{prefix}.orders.v{{schema_version}}"),
            schema_version: 1,
            keep_fields: None,
            drop_fields: vec!["region".into(), "currency".into()],
        }],
    });
    config
}

async fn enqueue(db: &TestDb, aggregate: &str, version: i64, schema: i32, body: Value) -> Uuid {
    let event = Event::new("order", aggregate, "OrderPlaced")
        .json(&body)
        .unwrap()
        .schema_version(schema)
        .aggregate_version(version);
    let mut tx = db.pool.begin().await.unwrap();
    let id = db.outbox().enqueue(&mut tx, &event).await.unwrap();
    tx.commit().await.unwrap();
    id
}

fn on(deliveries: &[Delivery], destination: &str) -> Vec<Delivery> {
    deliveries
        .iter()
        .filter(|d| d.destination == destination)
        .cloned()
        .collect()
}

fn body(d: &Delivery) -> Value {
    serde_json::from_slice(&d.payload).unwrap()
}

#[tokio::test]
async fn a_v2_event_goes_out_as_v2_and_v1_in_order_and_is_marked_once() {
    let db = TestDb::new(8).await;
    let prefix = unique("f");
    let reader = NatsReader::start(NATS_URL, &unique("F"), &prefix).await;
    let (v1, v2) = (format!("{prefix}.orders.v1"), format!("{prefix}.orders.v2"));
    // Five orders of four events each, all V2; and one V1 event from a writer not yet
    // migrated, which goes to orders.v1 once (its copy would be the same message).
    for n in 1..=4 {
        for a in 0..5 {
            let body = json!({"order_id": format!("o-{a}"), "total": n, "region": "eu", "currency": "EUR"});
            enqueue(&db, &format!("o-{a}"), n, 2, body).await;
        }
    }
    let old = enqueue(
        &db,
        "legacy",
        1,
        1,
        json!({"order_id": "legacy", "total": 1}),
    )
    .await;

    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        migration_config(&db, &prefix),
    )
    .await;
    let got = reader.wait_for(41, WAIT).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();

    assert_eq!(db.count("published").await, 21);
    let (as_v1, as_v2) = (on(&got, &v1), on(&got, &v2));
    assert_eq!((as_v1.len(), as_v2.len()), (21, 20), "{got:?}");
    for d in &as_v2 {
        assert_eq!(d.headers["schema-version"], "2");
        assert_eq!(d.headers["Nats-Msg-Id"], d.event_id);
        assert_eq!(body(d)["region"], "eu");
    }
    for d in as_v1.iter().filter(|d| d.event_id != old.to_string()) {
        assert_eq!(d.headers["schema-version"], "1");
        let b = body(d);
        assert!(
            b.get("region").is_none() && b.get("currency").is_none(),
            "{b}"
        );
        assert!(b["total"].is_number());
        // The inbox key is the event's; the broker's dedupe key is the copy's own.
        let id: Uuid = d.event_id.parse().unwrap();
        assert!(as_v2.iter().any(|v| v.event_id == d.event_id));
        assert_eq!(
            d.headers["Nats-Msg-Id"],
            copy_message_id(id, 1, &v1).to_string()
        );
    }
    let legacy: Vec<_> = got
        .iter()
        .filter(|d| d.event_id == old.to_string())
        .collect();
    assert_eq!(legacy.len(), 1, "a V1 event is not copied onto itself");
    for deliveries in [&as_v1, &as_v2] {
        let report = Report::of(deliveries);
        assert_eq!(report.order_violations, 0, "{report:?}");
        assert_eq!(report.duplicates, 0, "{report:?}");
    }
    reader.cleanup().await;
}

/// The real NATS publisher, failing the V1 copies' first attempts (transiently), and logging
/// every call.
struct FlakyCopies {
    inner: Arc<dyn Publisher>,
    failures_left: Mutex<u32>,
    log: Mutex<Vec<(String, bool)>>,
}

impl Publisher for FlakyCopies {
    fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            if m.schema_version == 1 {
                let mut left = self.failures_left.lock().unwrap();
                if *left > 0 {
                    *left -= 1;
                    self.log
                        .lock()
                        .unwrap()
                        .push((m.destination.clone(), false));
                    return Err(PublishError::transient("injected: copy not acknowledged"));
                }
            }
            let result = self.inner.publish(m).await;
            self.log
                .lock()
                .unwrap()
                .push((m.destination.clone(), result.is_ok()));
            result
        })
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn max_payload_bytes(&self) -> usize {
        self.inner.max_payload_bytes()
    }
}

#[tokio::test]
async fn a_failed_copy_retries_the_event_and_the_broker_keeps_one_of_each() {
    let db = TestDb::new(4).await;
    let prefix = unique("f");
    let reader = NatsReader::start(NATS_URL, &unique("F"), &prefix).await;
    let id = enqueue(&db, "o-1", 1, 2, json!({"total": 5, "region": "eu"})).await;
    let flaky = Arc::new(FlakyCopies {
        inner: common::nats(NATS_URL, &reader.stream).await,
        failures_left: Mutex::new(2),
        log: Mutex::new(Vec::new()),
    });
    let relay = common::start(&db, flaky.clone(), migration_config(&db, &prefix)).await;
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();

    // The V2 message was acknowledged on each of the three attempts, yet the row stayed
    // pending until its copy was acknowledged too (G3): three attempts are recorded.
    let (v1, v2) = (format!("{prefix}.orders.v1"), format!("{prefix}.orders.v2"));
    let log = flaky.log.lock().unwrap().clone();
    let expected: Vec<(String, bool)> = [(&v2, true), (&v1, false)]
        .repeat(2)
        .into_iter()
        .chain([(&v2, true), (&v1, true)])
        .map(|(d, ok)| (d.clone(), ok))
        .collect();
    assert_eq!(log, expected);
    let (status, attempts): (String, i32) = sqlx::query_as(
        &db.tables
            .render("SELECT status::text, attempts FROM {schema}.events WHERE event_id = $1"),
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), attempts), ("published", 3));
    // Three sends of the V2 message, one stored: JetStream dedupes on the event id, and the
    // copy, with an id of its own, was not taken for one of them.
    let got = reader.wait_for(2, WAIT).await;
    let js = async_nats::jetstream::new(async_nats::connect(NATS_URL).await.unwrap());
    let mut stream = js.get_stream(&reader.stream).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 2);
    assert_eq!(on(&got, &v2).len(), 1, "{got:?}");
    assert_eq!(on(&got, &v1).len(), 1, "{got:?}");
    reader.cleanup().await;
}

/// Before: no stream took the copy's subject, so every event of the type was dead-lettered
/// (and its aggregate parked behind it) although its V2 message had been stored each time.
#[tokio::test]
async fn a_copy_no_stream_takes_is_dropped_and_every_event_still_flows_in_order() {
    let db = TestDb::new(4).await;
    let prefix = unique("f");
    let nowhere = unique("nowhere");
    let reader = NatsReader::start(NATS_URL, &unique("F"), &prefix).await;
    let mut config = migration_config(&db, &prefix);
    config.routing.rules[0].fan_out[0].destination =
        format!("{nowhere}.orders.v{{schema_version}}");
    let publisher: Arc<dyn Publisher> = Arc::new(
        outbox_relayer::publishers::nats::NatsPublisher::connect(
            outbox_relayer::publishers::nats::NatsConfig {
                url: NATS_URL.into(),
                stream: reader.stream.clone(),
                create_stream: false,
                ack_timeout: Duration::from_secs(2),
                ..Default::default()
            },
        )
        .await
        .unwrap(),
    );
    let mut ids = Vec::new();
    for version in 1..=3 {
        for aggregate in ["o-1", "o-2"] {
            ids.push(enqueue(&db, aggregate, version, 2, json!({"total": version})).await);
        }
    }
    let relay = outbox_relayer::Relay::builder(db.pool.clone(), publisher, config)
        .build()
        .await
        .unwrap();
    let metrics = relay.metrics();
    let relay = relay.spawn();
    common::drained(&db, WAIT).await;
    relay.shutdown().await.unwrap();
    assert_eq!(db.count("dead").await, 0, "nothing dead-lettered");
    assert_eq!(db.count("published").await, 6);
    assert_eq!(metrics.sum("outbox_fanout_copies_dropped_total"), 6.0);
    let got = reader.wait_for(6, WAIT).await;
    let v2 = on(&got, &format!("{prefix}.orders.v2"));
    let order: Vec<String> = v2.iter().map(|d| d.event_id.clone()).collect();
    assert_eq!(order.len(), 6, "{got:?}");
    for aggregate in ["o-1", "o-2"] {
        let theirs: Vec<String> = ids
            .iter()
            .enumerate()
            .filter(|(i, _)| (i % 2 == 0) == (aggregate == "o-1"))
            .map(|(_, id)| id.to_string())
            .collect();
        let seen: Vec<String> = order
            .iter()
            .filter(|id| theirs.contains(id))
            .cloned()
            .collect();
        assert_eq!(seen, theirs, "{aggregate} in order");
    }
    reader.cleanup().await;
}
