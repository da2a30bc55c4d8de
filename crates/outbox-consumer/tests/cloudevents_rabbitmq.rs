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
