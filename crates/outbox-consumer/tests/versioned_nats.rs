//! Versioning end to end on real PostgreSQL and NATS: events written by the outbox, published
//! by the relay, consumed through the inbox. V1 events stored before a deployment reach the new
//! handler as V2; events sent as CloudEvents (binary or structured) are read like native ones.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_nats::jetstream;
use futures::future::BoxFuture;
use outbox::{Event, Outbox};
use outbox_consumer::{
    nats::{NatsConsumer, NatsSource},
    ConsumerConfig, Envelope, Handler, HandlerError, Processor, Upcasters,
};
use outbox_relayer::{
    cloudevents,
    fanout::FanOutCopy,
    publishers::nats::{NatsConfig, NatsPublisher},
    retry::RetryPolicy,
    routing::{RouteRule, RoutingConfig},
    Relay, RelayConfig, RelayHandle,
};
use outbox_testkit::{unique, wait_until, TestDb, NATS_URL};
use serde_json::{json, Value};
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// Keeps every envelope its handler was given.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<Envelope>>,
}

impl Recorder {
    fn seen(&self) -> Vec<Envelope> {
        self.seen.lock().unwrap().clone()
    }
}

impl Handler for Recorder {
    fn handle<'a>(
        &'a self,
        _tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.seen.lock().unwrap().push(event.clone());
            Ok(())
        })
    }
}

/// The upcaster the new consumer deploys with: V2 added `region`.
fn order_upcasters() -> Upcasters {
    Upcasters::new().register("OrderPlaced", 1, |mut v| {
        v.as_object_mut()
            .ok_or("an OrderPlaced payload is an object")?
            .insert("region".into(), json!("unknown"));
        Ok(v)
    })
}

/// One test's stream, subject prefix, outbox and relay settings.
struct Setup {
    db: TestDb,
    js: jetstream::Context,
    stream: String,
    prefix: String,
}

impl Setup {
    async fn new() -> Self {
        let db = TestDb::new(4).await;
        let js = jetstream::new(async_nats::connect(NATS_URL).await.unwrap());
        let stream = unique("V");
        let prefix = unique("v");
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
        Self {
            db,
            js,
            stream,
            prefix,
        }
    }

    async fn enqueue(&self, aggregate: &str, version: i32, body: Value) -> Uuid {
        let event = Event::new("order", aggregate, "OrderPlaced")
            .json(&body)
            .unwrap()
            .schema_version(version);
        let mut tx = self.db.pool.begin().await.unwrap();
        let id = self.db.outbox().enqueue(&mut tx, &event).await.unwrap();
        tx.commit().await.unwrap();
        id
    }

    async fn relay(&self, envelope: cloudevents::Envelope) -> RelayHandle {
        self.relay_with(envelope, vec![]).await
    }

    /// A relay routing by `rules` (the default route for the rest).
    async fn relay_with(
        &self,
        envelope: cloudevents::Envelope,
        rules: Vec<RouteRule>,
    ) -> RelayHandle {
        let publisher = NatsPublisher::connect(NatsConfig {
            url: NATS_URL.into(),
            stream: self.stream.clone(),
            ack_timeout: Duration::from_secs(2),
            ..Default::default()
        })
        .await
        .unwrap();
        let config = RelayConfig {
            schema: self.db.schema.clone(),
            lease_ttl: Duration::from_secs(2),
            heartbeat_interval: Duration::from_millis(500),
            poll_interval: Duration::from_millis(100),
            retry: RetryPolicy {
                initial_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(200),
                max_transient_backoff: Duration::from_millis(200),
                max_attempts: 3,
            },
            routing: RoutingConfig {
                default: format!("{}.{{aggregate_type}}.{{event_type}}", self.prefix),
                rules,
            },
            envelope,
            ..Default::default()
        };
        Relay::builder(self.db.pool.clone(), Arc::new(publisher), config)
            .build()
            .await
            .unwrap()
            .spawn()
    }

    async fn drained(&self) {
        wait_until("the outbox to drain", WAIT, || async {
            self.db.count("pending").await == 0
        })
        .await;
    }

    /// Consumer `name` with `processor`, running until the returned token is cancelled.
    async fn consume(
        &self,
        name: &str,
        processor: Processor,
    ) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let config = ConsumerConfig {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
            ..ConsumerConfig::new(name)
        };
        let consumer =
            NatsConsumer::connect(NatsSource::new(NATS_URL, &self.stream), config, processor)
                .await
                .unwrap();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move { consumer.run(token).await.unwrap() });
        (stop, task)
    }

    fn processor(&self, name: &str, handler: Arc<dyn Handler>) -> Processor {
        Processor::new(self.db.pool.clone(), &self.db.tables, name, handler)
    }

    async fn dead_letters(&self, consumer: &str) -> Vec<String> {
        let name = format!("{}_DEAD_{consumer}", self.stream);
        let Ok(mut stream) = self.js.get_stream(&name).await else {
            return Vec::new();
        };
        let count = stream.info().await.unwrap().state.messages;
        let mut reasons = Vec::new();
        for seq in 1..=count {
            let m = stream.get_raw_message(seq).await.unwrap();
            reasons.push(m.headers.get("dead-letter-reason").unwrap().to_string());
        }
        reasons
    }

    async fn cleanup(self, consumers: &[&str]) {
        for consumer in consumers {
            let _ = self
                .js
                .delete_stream(format!("{}_DEAD_{consumer}", self.stream))
                .await;
        }
        let _ = self.js.delete_stream(&self.stream).await;
    }
}

#[tokio::test]
async fn v1_events_stored_before_a_deployment_are_consumed_as_v2_after_it() {
    let s = Setup::new().await;
    // Before the deployment: the old writer stores V1 events, the relay publishes them.
    let mut v1 = Vec::new();
    for i in 0..5 {
        v1.push(
            s.enqueue(
                &format!("o-{i}"),
                1,
                json!({"order_id": format!("o-{i}"), "total": 10.5 + i as f64}),
            )
            .await,
        );
    }
    let relay = s.relay(cloudevents::Envelope::Outbox).await;
    s.drained().await;
    // After it: the new writer stores V2 events (some for the same orders), and an event
    // from a writer newer than this consumer (V3) arrives too.
    let mut v2 = Vec::new();
    for i in 3..8 {
        v2.push(
            s.enqueue(
                &format!("o-{i}"),
                2,
                json!({"order_id": format!("o-{i}"), "total": 1, "region": "eu"}),
            )
            .await,
        );
    }
    let v3 = s
        .enqueue(
            "o-9",
            3,
            json!({"order_id": "o-9", "total": 1, "region": "eu", "currency": "EUR"}),
        )
        .await;
    s.drained().await;
    relay.shutdown().await.unwrap();

    let handler = Arc::new(Recorder::default());
    let processor = s
        .processor("billing", handler.clone())
        .with_upcasters(order_upcasters());
    let (stop, task) = s.consume("billing", processor).await;
    wait_until(
        "10 events handled and the V3 one dead-lettered",
        WAIT,
        || async { handler.seen().len() == 10 && s.dead_letters("billing").await.len() == 1 },
    )
    .await;
    stop.cancel();
    task.await.unwrap();

    let seen = handler.seen();
    assert!(
        seen.iter().all(|e| e.schema_version == 2),
        "the handler sees only V2"
    );
    for e in &seen {
        let body: Value = e.json().unwrap();
        let expected = if v1.contains(&e.event_id) {
            "unknown"
        } else {
            assert!(v2.contains(&e.event_id));
            "eu"
        };
        assert_eq!(body["region"], expected, "{body}");
        assert!(body["total"].is_number() && body["order_id"].is_string());
    }
    assert!(seen.iter().all(|e| e.event_id != v3));
    let reasons = s.dead_letters("billing").await;
    assert_eq!(
        reasons,
        ["OrderPlaced schema_version 3 is newer than this consumer's current version 2"]
    );
    s.cleanup(&["billing"]).await;
}

#[tokio::test]
async fn cloudevents_binary_and_structured_round_trip_through_the_consumer() {
    for envelope in [
        cloudevents::Envelope::CloudeventsBinary,
        cloudevents::Envelope::CloudeventsStructured,
    ] {
        let s = Setup::new().await;
        let json_id = s
            .enqueue("o-1", 2, json!({"order_id": "o-1", "total": 3}))
            .await;
        let bytes = Event::new("order", "o-1", "Scanned")
            .payload(vec![0u8, 159, 146, 150], "application/octet-stream")
            .aggregate_version(2);
        let mut tx = s.db.pool.begin().await.unwrap();
        let bytes_id = s.db.outbox().enqueue(&mut tx, &bytes).await.unwrap();
        tx.commit().await.unwrap();

        let relay = s.relay(envelope).await;
        let handler = Arc::new(Recorder::default());
        let (stop, task) = s
            .consume("reader", s.processor("reader", handler.clone()))
            .await;
        wait_until("both events handled", WAIT, || async {
            handler.seen().len() == 2
        })
        .await;
        stop.cancel();
        task.await.unwrap();
        relay.shutdown().await.unwrap();

        let seen = handler.seen();
        let json_event = seen.iter().find(|e| e.event_id == json_id).unwrap();
        assert_eq!(json_event.event_type, "OrderPlaced", "{envelope:?}");
        assert_eq!(json_event.schema_version, 2);
        assert_eq!(json_event.aggregate_type.as_deref(), Some("order"));
        assert_eq!(json_event.aggregate_id.as_deref(), Some("o-1"));
        assert!(json_event.occurred_at.is_some());
        assert_eq!(
            json_event.json::<Value>().unwrap(),
            json!({"order_id": "o-1", "total": 3})
        );
        let bytes_event = seen.iter().find(|e| e.event_id == bytes_id).unwrap();
        assert_eq!(
            bytes_event.payload.as_ref(),
            [0u8, 159, 146, 150],
            "{envelope:?}"
        );
        assert_eq!(bytes_event.aggregate_version, Some(2));
        // What went on the wire is CloudEvents, not the native headers.
        let wire = &json_event.headers;
        match envelope {
            cloudevents::Envelope::CloudeventsBinary => {
                assert_eq!(wire["ce-specversion"], "1.0");
                assert_eq!(wire["ce-id"], json_id.to_string());
                assert_eq!(wire["ce-source"], "/outbox/order");
            }
            _ => assert_eq!(wire["content-type"], cloudevents::STRUCTURED_CONTENT_TYPE),
        }
        assert!(!wire.contains_key("event-id"));
        s.cleanup(&[]).await;
    }
}

/// Fails the first attempt of every event's own message (not of a copy), then records.
#[derive(Default)]
struct FailsOwnMessageOnce {
    failed: Mutex<Vec<Uuid>>,
    applied: Recorder,
}

impl Handler for FailsOwnMessageOnce {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            if event.copy_of_schema_version.is_none() {
                let mut failed = self.failed.lock().unwrap();
                if !failed.contains(&event.event_id) {
                    failed.push(event.event_id);
                    return Err(HandlerError::new("first attempt fails"));
                }
            }
            self.applied.handle(tx, event).await
        })
    }
}

/// Versioning item 5. A V2 consumer reads both destinations during a migration (old writers'
/// V1 events go to `orders.v1` only). Before: the event's V2 message failed once, its V1 copy
/// behind it was applied (upcast, `region` "unknown"), and the V2 redelivery was skipped as a
/// duplicate. With copies skipped, every event applies once from its own message.
#[tokio::test]
async fn a_consumer_of_both_destinations_applies_the_stored_version_never_a_copy() {
    let s = Setup::new().await;
    let old = s
        .enqueue("o-0", 1, json!({"order_id": "o-0", "total": 1}))
        .await;
    let mut new = Vec::new();
    for i in 1..=5 {
        let body = json!({"order_id": format!("o-{i}"), "total": i, "region": "eu"});
        new.push(s.enqueue(&format!("o-{i}"), 2, body).await);
    }
    let destination = format!("{}.orders.v{{schema_version}}", s.prefix);
    let rule = RouteRule {
        event_type: Some("OrderPlaced".into()),
        aggregate_type: None,
        destination: destination.clone(),
        fan_out: vec![FanOutCopy {
            destination,
            schema_version: 1,
            keep_fields: None,
            drop_fields: vec!["region".into()],
        }],
    };
    let relay = s
        .relay_with(cloudevents::Envelope::Outbox, vec![rule])
        .await;
    s.drained().await;
    relay.shutdown().await.unwrap();

    let handler = Arc::new(FailsOwnMessageOnce::default());
    let processor = s
        .processor("billing", handler.clone())
        .with_upcasters(order_upcasters())
        .skip_fan_out_copies();
    let metrics = processor.metrics().clone();
    let (stop, task) = s.consume("billing", processor).await;
    wait_until("six events applied", WAIT, || async {
        handler.applied.seen().len() == 6
    })
    .await;
    wait_until("five copies skipped", WAIT, || async {
        metrics.count("billing", outbox_consumer::Count::CopiesSkipped) == 5
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    let seen = handler.applied.seen();
    let mut ids: Vec<Uuid> = seen.iter().map(|e| e.event_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 6, "each event once");
    for e in &seen {
        let body: Value = e.json().unwrap();
        let region = if e.event_id == old { "unknown" } else { "eu" };
        assert_eq!(body["region"], region, "{body}");
        assert_eq!(e.copy_of_schema_version, None, "never a copy");
    }
    assert_eq!(
        handler.failed.lock().unwrap().len(),
        6,
        "each failed once first"
    );
    assert!(new.iter().all(|id| seen.iter().any(|e| e.event_id == *id)));
    s.cleanup(&["billing"]).await;
}
