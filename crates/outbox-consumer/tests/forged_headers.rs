//! A writer's headers cannot stand in for the relay's. With the default native envelope a
//! writer's `ce-*` headers never travel: otherwise the consumer's `Envelope::decode`, which
//! reads a message carrying `ce-specversion` as a binary CloudEvent, would take the event id
//! (what the inbox dedupes on), type, aggregate and version from them. Two writer headers
//! differing only in case travel once.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use outbox_consumer::Envelope;
use outbox_relayer::{
    publishers::nats::{NatsConfig, NatsPublisher},
    routing::RoutingConfig,
    Relay, RelayConfig,
};
use outbox_testkit::{unique, NatsReader, TestDb, NATS_URL};
use uuid::Uuid;

async fn relay_one(headers: serde_json::Value) -> (Uuid, outbox_testkit::Delivery) {
    let db = TestDb::new(2).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let event_id = Uuid::now_v7();
    sqlx::query(&db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, \
         aggregate_version, event_type, destination, payload, content_type, headers) VALUES \
         ($1, 'order', 'mine', 1, 'Placed', $2, '\\x7b7d', 'application/json', $3::text::jsonb)",
    ))
    .bind(event_id)
    .bind(format!("{prefix}.order.Placed"))
    .bind(headers.to_string())
    .execute(&db.pool)
    .await
    .unwrap();
    let publisher = NatsPublisher::connect(NatsConfig {
        url: NATS_URL.into(),
        stream: reader.stream.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let config = RelayConfig {
        schema: db.schema.clone(),
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        poll_interval: Duration::from_millis(100),
        routing: RoutingConfig::default(),
        ..Default::default()
    };
    let relay = Relay::builder(db.pool.clone(), Arc::new(publisher), config)
        .build()
        .await
        .unwrap()
        .spawn();
    let got = reader.wait_for(1, Duration::from_secs(60)).await;
    relay.shutdown().await.unwrap();
    reader.cleanup().await;
    (event_id, got[0].clone())
}

#[tokio::test]
async fn a_writers_ce_headers_forge_the_event_id_and_aggregate_the_consumer_sees() {
    let victim_id = Uuid::now_v7();
    let (event_id, got) = relay_one(serde_json::json!({
        "ce-specversion": "1.0",
        "ce-id": victim_id.to_string(),
        "ce-source": "/outbox/account",
        "ce-type": "Debited",
        "ce-subject": "victim",
        "ce-aggregatetype": "account",
        "ce-aggregateversion": "7",
    }))
    .await;
    let envelope = Envelope::decode(
        got.destination.clone(),
        got.headers.clone(),
        Bytes::from(got.payload.clone()),
    )
    .unwrap();
    assert_eq!(
        (
            envelope.event_id,
            envelope.aggregate_type.as_deref(),
            envelope.aggregate_id.as_deref(),
            envelope.aggregate_version,
            envelope.event_type.as_str(),
        ),
        (event_id, Some("order"), Some("mine"), Some(1), "Placed"),
        "the consumer decoded the writer's forged identity; headers on the wire: {:?}",
        got.headers
    );
}

/// docs/security.md §2: "two writer headers differing only in case travel once".
#[tokio::test]
async fn two_writer_headers_differing_in_case_travel_once() {
    let (_, got) = relay_one(serde_json::json!({
        "Traceparent": "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }))
    .await;
    let same: Vec<_> = got
        .headers
        .keys()
        .filter(|k| k.eq_ignore_ascii_case("traceparent"))
        .collect();
    assert_eq!(same.len(), 1, "{:?}", got.headers);
}
