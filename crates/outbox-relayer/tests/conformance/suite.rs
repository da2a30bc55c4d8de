//! The behaviour tests, generic over a [`Harness`].

use std::{
    collections::BTreeMap,
    future::Future,
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use chrono::Utc;
use outbox_relayer::{FailureClass, Message, PublishError, Publisher};
use outbox_testkit::{free_port, BrokerProcess, Delivery, Report};
use uuid::Uuid;

/// How long any single wait in the suite may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(60);

/// One broker, as the suite drives it. Each harness owns a namespace of its own (stream,
/// exchange and queue, topics, queues…) so the suites run in parallel on the shared broker.
pub trait Harness: Sized + Send + Sync + 'static {
    /// Whether the broker drops a second message with the same event id.
    const DEDUPES: bool;

    /// URL of the machine's shared broker.
    fn shared_url() -> String;

    /// URL of a private broker listening on `port`.
    fn private_url(port: u16) -> String;

    /// The foreground command that runs a private broker on `port`, keeping its data in
    /// `broker.dir`.
    fn private_server(broker: &BrokerProcess) -> Command;

    /// A fresh namespace on the broker at `url`. Nothing is created yet.
    fn new(url: String) -> Self;

    /// Creates what the namespace needs (stream, queue and binding, topics…) and starts any
    /// reader that must subscribe before messages are published. Fails while the broker is
    /// unreachable.
    fn prepare(&mut self) -> impl Future<Output = Result<(), String>> + Send;

    /// The `i`-th destination of the namespace (the suite spreads messages over several).
    fn destination(&self, i: usize) -> String;

    /// A destination the broker cannot deliver to, where it has that notion.
    fn unroutable(&self) -> Option<String>;

    /// A publisher into the namespace. Must succeed while the broker is down.
    fn publisher(&self) -> impl Future<Output = Arc<dyn Publisher>> + Send;

    /// Waits until at least `n` messages can be read with the broker's own client and
    /// returns all of them, in the broker's order (per destination).
    fn read(&self, n: usize) -> impl Future<Output = Vec<Delivery>> + Send;

    /// Deletes what `prepare` created.
    fn cleanup(self) -> impl Future<Output = ()> + Send;
}

/// A message as the relay would hand it over.
pub fn message(destination: String, aggregate: &str, version: i64, payload: &[u8]) -> Message {
    let event_id = Uuid::now_v7();
    Message {
        id: version,
        event_id,
        message_id: event_id,
        aggregate_type: "order".into(),
        aggregate_id: aggregate.into(),
        aggregate_version: Some(version),
        event_type: "OrderPlaced".into(),
        schema_version: 3,
        destination,
        payload: Bytes::copy_from_slice(payload),
        content_type: "application/json".into(),
        headers: BTreeMap::from([
            (
                "traceparent".to_owned(),
                "00-4bf92f3577b34da6-00f067aa0ba902b7-01".to_owned(),
            ),
            (
                "correlation-id".to_owned(),
                format!("corr-{aggregate}-{version}"),
            ),
        ]),
        occurred_at: Utc::now(),
        attempts: 0,
        native_headers: true,
    }
}

async fn prepared<H: Harness>() -> H {
    let mut harness = H::new(H::shared_url());
    harness.prepare().await.expect("prepare the namespace");
    harness
}

/// Publishes, retrying transient failures as the relay does, until acknowledged.
pub async fn publish_until_acked(publisher: &dyn Publisher, message: &Message) {
    let deadline = Instant::now() + WAIT;
    loop {
        match publisher.publish(message).await {
            Ok(()) => return,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("publish of {} failed: {e}", message.event_id),
        }
    }
}

/// The payload arrives unchanged and the metadata is readable by a consumer.
pub async fn carries_payload_and_metadata<H: Harness>() {
    let harness = prepared::<H>().await;
    let publisher = harness.publisher().await;
    let payload = r#"{"order":"A-1","note":"naïve café ✓","amount":12.5}"#.as_bytes();
    let sent: Vec<Message> = (1..=3)
        .map(|v| message(harness.destination(0), "agg-meta", v, payload))
        .collect();
    for m in &sent {
        publish_until_acked(&*publisher, m).await;
    }
    let read = harness.read(sent.len()).await;
    assert_eq!(
        read.len(),
        sent.len(),
        "exactly the published messages: {read:?}"
    );
    for (m, d) in sent.iter().zip(&read) {
        assert_eq!(d.payload, payload, "payload must arrive byte for byte");
        assert_eq!(d.event_id, m.event_id.to_string());
        assert_eq!(d.aggregate_type, "order");
        assert_eq!(d.aggregate_id, "agg-meta");
        assert_eq!(d.version, m.aggregate_version);
        let h = &d.headers;
        assert_eq!(h.get("event-type").map(String::as_str), Some("OrderPlaced"));
        assert_eq!(h.get("schema-version").map(String::as_str), Some("3"));
        assert_eq!(
            h.get("traceparent").map(String::as_str),
            Some("00-4bf92f3577b34da6-00f067aa0ba902b7-01"),
            "the writer's headers travel too: {h:?}"
        );
        assert_eq!(
            h.get("correlation-id"),
            Some(&format!("corr-agg-meta-{}", m.aggregate_version.unwrap()))
        );
        assert!(h.contains_key("occurred-at"), "{h:?}");
    }
    harness.cleanup().await;
}

/// Many aggregates publish at once, each strictly one message after the other (as the relay's
/// lanes do); every aggregate's messages arrive in order.
pub async fn keeps_order_per_aggregate<H: Harness>() {
    const AGGREGATES: usize = 8;
    const EACH: i64 = 25;
    let harness = prepared::<H>().await;
    let publisher = harness.publisher().await;
    let mut lanes = tokio::task::JoinSet::new();
    for a in 0..AGGREGATES {
        let publisher = publisher.clone();
        // Two aggregates share each destination, so order is checked within a shared one.
        let destination = harness.destination(a % 4);
        lanes.spawn(async move {
            for v in 1..=EACH {
                let m = message(destination.clone(), &format!("agg-{a}"), v, b"{}");
                publish_until_acked(&*publisher, &m).await;
            }
        });
    }
    while let Some(done) = lanes.join_next().await {
        done.expect("lane");
    }
    let total = AGGREGATES * EACH as usize;
    let read = harness.read(total).await;
    let report = Report::of(&read);
    assert_eq!(report.unique, total, "{report:?}");
    assert_eq!(report.duplicates, 0, "{report:?}");
    assert_eq!(report.order_violations, 0, "{report:?}");
    harness.cleanup().await;
}

fn assert_permanent(result: Result<(), PublishError>, what: &str) -> String {
    match result {
        Err(e) if e.class == FailureClass::Permanent => e.message,
        other => panic!("{what} must fail as permanent, got {other:?}"),
    }
}

/// A payload over the publisher's limit fails as permanent and names the limit.
pub async fn oversized_is_permanent<H: Harness>() {
    let harness = prepared::<H>().await;
    let publisher = harness.publisher().await;
    let limit = publisher.max_payload_bytes();
    let big = vec![b'x'; limit + 1];
    let m = message(harness.destination(0), "agg-big", 1, &big);
    let reason = assert_permanent(publisher.publish(&m).await, "an oversized message");
    assert!(
        reason.contains(&limit.to_string()),
        "names the limit: {reason}"
    );
    // The publisher still works afterwards.
    let ok = message(harness.destination(0), "agg-big", 2, b"{}");
    publish_until_acked(&*publisher, &ok).await;
    assert_eq!(harness.read(1).await.len(), 1);
    harness.cleanup().await;
}

/// A destination the broker cannot route to fails as permanent (brokers without the notion
/// skip this test's assertion and say so).
pub async fn unroutable_is_permanent<H: Harness>() {
    let harness = prepared::<H>().await;
    let Some(destination) = harness.unroutable() else {
        println!("this broker has no notion of an unroutable destination");
        harness.cleanup().await;
        return;
    };
    let publisher = harness.publisher().await;
    let m = message(destination, "agg-lost", 1, b"{}");
    let reason = assert_permanent(publisher.publish(&m).await, "an unroutable message");
    println!("unroutable: {reason}");
    harness.cleanup().await;
}

/// With nothing listening, a publish fails as transient within the suite's wait; once a broker
/// runs on that port, the same messages go through and all arrive.
pub async fn unreachable_is_transient_then_recovers<H: Harness>() {
    let port = free_port();
    let mut broker = BrokerProcess::prepare(port);
    let mut harness = H::new(H::private_url(port));
    let publisher = harness.publisher().await;
    let sent: Vec<Message> = (1..=5)
        .map(|v| message(harness.destination(0), "agg-outage", v, b"{}"))
        .collect();
    let started = Instant::now();
    let outcome = tokio::time::timeout(WAIT, publisher.publish(&sent[0]))
        .await
        .expect("a publish to an unreachable broker must give up, not hang");
    match outcome {
        Err(e) if e.is_transient() => println!(
            "unreachable: transient after {:?}: {}",
            started.elapsed(),
            e.message
        ),
        other => panic!("an unreachable broker must fail as transient, got {other:?}"),
    }
    broker.start(H::private_server(&broker)).await;
    let deadline = Instant::now() + WAIT;
    while let Err(e) = harness.prepare().await {
        assert!(
            Instant::now() < deadline,
            "private broker never became ready: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for m in &sent {
        publish_until_acked(&*publisher, m).await;
    }
    let read = harness.read(sent.len()).await;
    let report = Report::of(&read);
    assert_eq!(report.unique, sent.len(), "{report:?}");
    assert_eq!(report.order_violations, 0, "{report:?}");
    harness.cleanup().await;
    broker.stop();
}

/// A second publish of the same event id: dropped where the broker dedupes, delivered again
/// with the same event id (for the consumer's inbox) where it does not.
pub async fn same_event_id_twice<H: Harness>() {
    let harness = prepared::<H>().await;
    let publisher = harness.publisher().await;
    let first = message(harness.destination(0), "agg-dup", 1, b"{}");
    publish_until_acked(&*publisher, &first).await;
    publish_until_acked(&*publisher, &first).await;
    let marker = message(harness.destination(0), "agg-dup", 2, b"{}");
    publish_until_acked(&*publisher, &marker).await;
    let expected = if H::DEDUPES { 2 } else { 3 };
    let read = harness.read(expected).await;
    let copies = read
        .iter()
        .filter(|d| d.event_id == first.event_id.to_string())
        .count();
    if H::DEDUPES {
        assert_eq!(copies, 1, "the broker must drop the second copy: {read:?}");
    } else {
        assert_eq!(
            copies, 2,
            "without broker dedupe both copies arrive: {read:?}"
        );
    }
    assert_eq!(
        read.last().map(|d| d.event_id.clone()),
        Some(marker.event_id.to_string())
    );
    harness.cleanup().await;
}

/// Generates the suite's tests for a harness, in the module that invokes it.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:ty) => {
        #[tokio::test]
        async fn carries_payload_and_metadata() {
            $crate::suite::carries_payload_and_metadata::<$harness>().await;
        }

        #[tokio::test]
        async fn keeps_order_per_aggregate() {
            $crate::suite::keeps_order_per_aggregate::<$harness>().await;
        }

        #[tokio::test]
        async fn oversized_is_permanent() {
            $crate::suite::oversized_is_permanent::<$harness>().await;
        }

        #[tokio::test]
        async fn unroutable_is_permanent() {
            $crate::suite::unroutable_is_permanent::<$harness>().await;
        }

        #[tokio::test]
        async fn unreachable_is_transient_then_recovers() {
            $crate::suite::unreachable_is_transient_then_recovers::<$harness>().await;
        }

        #[tokio::test]
        async fn same_event_id_twice() {
            $crate::suite::same_event_id_twice::<$harness>().await;
        }
    };
}
