//! CloudEvents over AMQP end to end: the relay publishes to real RabbitMQ in binary mode
//! (`cloudEvents:` application properties, the content-type property) and in structured mode;
//! `RabbitMqConsumer` reads both like native messages.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;
use lapin::{
    options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::FieldTable,
    Connection, ConnectionProperties, ExchangeKind,
};
use outbox::{Event, Outbox};
use outbox_consumer::{
    rabbitmq::{RabbitMqConsumer, RabbitMqSource},
    ConsumerConfig, Envelope, Handler, HandlerError, Processor,
};
use outbox_relayer::{
    cloudevents::Envelope as Mode,
    publishers::rabbitmq::{RabbitMqConfig, RabbitMqPublisher},
    routing::RoutingConfig,
    Relay, RelayConfig,
};
use outbox_testkit::{unique, wait_until, TestDb, RABBITMQ_URL};
use serde_json::{json, Value};
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Recorder(Mutex<Vec<Envelope>>);

impl Handler for Recorder {
    fn handle<'a>(
        &'a self,
        _tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.0.lock().unwrap().push(event.clone());
            Ok(())
        })
    }
}

#[tokio::test]
async fn both_cloudevents_modes_round_trip_through_rabbitmq() {
    for mode in [Mode::CloudeventsBinary, Mode::CloudeventsStructured] {
        let db = TestDb::new(4).await;
        let (exchange, queue) = (unique("ce"), unique("ceq"));
        let conn = Connection::connect(RABBITMQ_URL, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                &exchange,
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_declare(
                &queue,
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                &queue,
                &exchange,
                "#",
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();

        let event = Event::new("order", "o-1", "OrderPlaced")
            .json(&json!({"order_id": "o-1", "total": 3}))
            .unwrap()
            .schema_version(2)
            .aggregate_version(1);
        let mut tx = db.pool.begin().await.unwrap();
        let id = db.outbox().enqueue(&mut tx, &event).await.unwrap();
        tx.commit().await.unwrap();

        let publisher = RabbitMqPublisher::connect(RabbitMqConfig {
            url: RABBITMQ_URL.into(),
            exchange: exchange.clone(),
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
            envelope: mode,
            ..Default::default()
        };
        let relay = Relay::builder(db.pool.clone(), Arc::new(publisher), config)
            .build()
            .await
            .unwrap()
            .spawn();

        let handler = Arc::new(Recorder::default());
        let processor = Processor::new(db.pool.clone(), &db.tables, "reader", handler.clone());
        let consumer = RabbitMqConsumer::connect(
            RabbitMqSource::new(RABBITMQ_URL, &queue),
            ConsumerConfig::new("reader"),
            processor,
        )
        .await
        .unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(consumer.run(stop.clone()));
        wait_until("the event handled", WAIT, || async {
            !handler.0.lock().unwrap().is_empty()
        })
        .await;
        stop.cancel();
        task.await.unwrap().unwrap();
        relay.shutdown().await.unwrap();

        let seen = handler.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{mode:?}");
        let e = &seen[0];
        assert_eq!(e.event_id, id, "{mode:?}");
        assert_eq!(e.event_type, "OrderPlaced");
        assert_eq!(e.schema_version, 2);
        assert_eq!(e.aggregate_id.as_deref(), Some("o-1"));
        assert_eq!(e.aggregate_version, Some(1));
        assert_eq!(
            e.json::<Value>().unwrap(),
            json!({"order_id": "o-1", "total": 3})
        );
        match mode {
            Mode::CloudeventsBinary => {
                assert_eq!(e.headers["cloudEvents:specversion"], "1.0");
                assert_eq!(e.headers["cloudEvents:id"], id.to_string());
                // datacontenttype travels as the AMQP content-type property.
                assert_eq!(e.headers["content-type"], "application/json");
            }
            _ => assert_eq!(e.headers["content-type"], "application/cloudevents+json"),
        }
        assert!(!e.headers.contains_key("event-id"));
        let _ = channel
            .queue_delete(&format!("{queue}.dead"), QueueDeleteOptions::default())
            .await;
        let _ = channel
            .queue_delete(&queue, QueueDeleteOptions::default())
            .await;
        let _ = channel.exchange_delete(&exchange, Default::default()).await;
    }
}

/// A CloudEvents producer on AMQP that sends its numeric attributes as AMQP integers (as the
/// binding allows): the versions still reach the gate, which applies version 1 before
/// version 2 though 2 arrived first, and the schema version reaches the event.
#[tokio::test]
async fn integer_cloudevents_attributes_over_amqp_keep_their_order() {
    use lapin::{
        options::{BasicPublishOptions, ConfirmSelectOptions},
        types::{AMQPValue, LongString},
        BasicProperties,
    };
    use outbox_consumer::VersionGate;

    let db = TestDb::new(1).await;
    let queue = unique("ceint");
    let conn = Connection::connect(RABBITMQ_URL, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    channel
        .queue_declare(
            &queue,
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for version in [2_i32, 1] {
        let mut headers = FieldTable::default();
        let text = |s: &str| AMQPValue::LongString(LongString::from(s.to_owned()));
        headers.insert("cloudEvents:specversion".into(), text("1.0"));
        headers.insert(
            "cloudEvents:id".into(),
            text(&uuid::Uuid::now_v7().to_string()),
        );
        headers.insert("cloudEvents:source".into(), text("/elsewhere"));
        headers.insert("cloudEvents:type".into(), text("OrderPlaced"));
        headers.insert("cloudEvents:subject".into(), text("o-1"));
        headers.insert("cloudEvents:aggregatetype".into(), text("order"));
        headers.insert(
            "cloudEvents:aggregateversion".into(),
            AMQPValue::LongInt(version),
        );
        headers.insert("cloudEvents:schemaversion".into(), AMQPValue::LongInt(2));
        channel
            .basic_publish(
                "",
                &queue,
                BasicPublishOptions::default(),
                br#"{"total":1}"#,
                BasicProperties::default()
                    .with_headers(headers)
                    .with_content_type("application/json".into()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let handler = Arc::new(Recorder::default());
    let processor = Processor::new(db.pool.clone(), &db.tables, "reader", handler.clone())
        .with_version_gate(VersionGate::starting_at(1));
    let consumer = RabbitMqConsumer::connect(
        RabbitMqSource::new(RABBITMQ_URL, &queue),
        ConsumerConfig::new("reader"),
        processor,
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    wait_until("both versions handled", WAIT, || async {
        handler.0.lock().unwrap().len() == 2
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    let seen: Vec<(Option<i64>, i32)> = handler
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.aggregate_version, e.schema_version))
        .collect();
    assert_eq!(seen, vec![(Some(1), 2), (Some(2), 2)]);
    for name in [format!("{queue}.dead"), queue] {
        let _ = channel
            .queue_delete(&name, QueueDeleteOptions::default())
            .await;
    }
}
