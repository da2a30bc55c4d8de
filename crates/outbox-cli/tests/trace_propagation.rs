//! One trace from the writer's transaction to the consumer's handler. An event is written in a
//! traced transaction, published by the `outbox relay` process (exporting over OTLP, configured
//! only by the standard variables) and handled by a consumer runner. A real OTLP receiver, which
//! decodes the protocol, gets one trace: the writer's span, the relay's `send` span (its child)
//! and the consumer's `process` span (the relay span's child), in that order. A command the
//! handler writes carries the same trace on. Polling with the NATS and the RabbitMQ runners, and
//! the CDC relay with a table-less write (the trace travels in the WAL message).

mod otlp;
mod support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider},
    Resource,
};
use outbox::{
    postgres::{MigrateOptions, WriteMode},
    Event, Outbox,
};
use outbox_consumer::{
    nats::{NatsConsumer, NatsSource},
    rabbitmq::{RabbitMqConsumer, RabbitMqSource},
    ConsumerConfig, Envelope, Handler, HandlerError, Processor,
};
use outbox_testkit::{
    cdc_database_url, unique, wait_until, NatsReader, RabbitReader, TestDb, NATS_URL, RABBITMQ_URL,
};
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use otlp::{Received, Receiver};
use support::{fast_config, run, RelayProcess};

const WAIT: Duration = Duration::from_secs(60);

/// OTLP span kinds.
const PRODUCER: i32 = 4;
const CONSUMER: i32 = 5;

/// The application's side of the test: its tracer provider, exporting to `receiver` as
/// `orders-app`, quickly.
fn app_tracing(receiver: &Receiver) -> SdkTracerProvider {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{}/v1/traces", receiver.endpoint))
        .build()
        .unwrap();
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(Duration::from_millis(100))
                .build(),
        )
        .build();
    SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name("orders-app").build())
        .with_span_processor(processor)
        .build()
}

/// Handles `OrderPlaced`: notes the trace it runs in, and writes a `ShipOrder` command through
/// the outbox (as a saga step would).
struct Shipping {
    outbox: outbox::postgres::PgOutbox,
    seen: Mutex<Vec<String>>,
}

impl Handler for Shipping {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            if event.event_type != "OrderPlaced" {
                return Ok(());
            }
            let cx = tracing::Span::current().context();
            let trace = cx.span().span_context().trace_id().to_string();
            self.seen.lock().unwrap().push(trace);
            let command = Event::new("shipment", "o-1", "ShipOrder");
            self.outbox
                .enqueue(tx, &command)
                .await
                .map_err(|e| HandlerError::new(e.to_string()))?;
            Ok(())
        })
    }
}

/// Writes one `OrderPlaced` with `mode` in a transaction inside the span `place order`;
/// returns that span's trace id.
async fn place_order(db: &TestDb, mode: WriteMode) -> String {
    let span = tracing::info_span!("place order");
    let trace = span.context().span().span_context().trace_id().to_string();
    async {
        let mut tx = db.pool.begin().await.unwrap();
        db.outbox()
            .write_mode(mode)
            .enqueue(&mut tx, &Event::new("order", "o-1", "OrderPlaced"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    .instrument(span)
    .await;
    trace
}

/// Waits until `receiver` holds the three spans of `trace`, and checks how they link.
async fn check_one_trace(receiver: &Receiver, trace: &str, system: &str) {
    let of_trace = || -> Vec<Received> {
        receiver
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == trace)
            .collect()
    };
    wait_until("the three spans of the trace to arrive", WAIT, || async {
        let spans = of_trace();
        spans.iter().any(|s| s.name == "place order")
            && spans.iter().any(|s| s.kind == PRODUCER)
            && spans
                .iter()
                .any(|s| s.kind == CONSUMER && s.name.contains(".order.OrderPlaced"))
    })
    .await;
    let spans = of_trace();
    let writer = spans.iter().find(|s| s.name == "place order").unwrap();
    let send = spans
        .iter()
        .find(|s| s.kind == PRODUCER && s.parent_span_id == writer.span_id)
        .unwrap_or_else(|| panic!("no relay span under the writer's: {spans:#?}"));
    let process = spans
        .iter()
        .find(|s| s.kind == CONSUMER && s.parent_span_id == send.span_id)
        .unwrap_or_else(|| panic!("no consumer span under the relay's: {spans:#?}"));
    assert_eq!(writer.service, "orders-app");
    assert_eq!(send.service, "outbox-relay");
    assert_eq!(process.service, "orders-app");
    assert!(send.name.starts_with("send ") && send.name.ends_with(".order.OrderPlaced"));
    assert_eq!(send.attributes["messaging.system"], system);
    assert_eq!(send.attributes["messaging.operation.type"], "send");
    assert_eq!(
        send.attributes["messaging.destination.name"],
        send.name["send ".len()..]
    );
    assert_eq!(process.attributes["messaging.system"], system);
    assert_eq!(
        process.attributes["messaging.consumer.group.name"],
        "shipping"
    );
    assert_eq!(
        process.attributes["messaging.message.id"],
        send.attributes["messaging.message.id"]
    );
    assert!(writer.start <= send.start && send.start <= process.start);
}

/// The `ShipOrder` row the handler wrote carries the handler's trace.
async fn command_trace(db: &TestDb) -> String {
    let headers: serde_json::Value = sqlx::query_scalar(
        &db.tables
            .render("SELECT headers FROM {schema}.{events} WHERE event_type = 'ShipOrder'"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let traceparent = headers["traceparent"].as_str().unwrap_or_default();
    traceparent.split('-').nth(1).unwrap_or_default().to_owned()
}

/// The broker a case runs on.
#[derive(Clone, Copy, PartialEq)]
enum Broker {
    Nats,
    Rabbitmq,
}

/// Writes an event in a traced transaction (table-less in CDC mode, through the WAL alone),
/// runs the relay process (polling, or `--mode cdc` on the logical server) exporting to a
/// receiver, handles the event with `broker`'s consumer runner, and checks the trace.
async fn one_trace(broker: Broker, cdc: bool) {
    let receiver = Receiver::start();
    let provider = app_tracing(&receiver);
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("orders-app")));
    let _scope = tracing::subscriber::set_default(subscriber);

    let db = if cdc {
        let db = TestDb::on(
            &cdc_database_url(),
            MigrateOptions {
                partitions: Some(2),
                ..Default::default()
            },
        )
        .await;
        let out = run(&[
            "migrate",
            "--database-url",
            &db.url,
            "--schema",
            &db.schema,
            "--cdc",
        ]);
        assert!(out.status.success(), "{out:?}");
        db
    } else {
        TestDb::new(2).await
    };
    let prefix = unique("p");
    let shipping = Arc::new(Shipping {
        outbox: db.outbox(),
        seen: Mutex::default(),
    });
    let processor = Processor::new(db.pool.clone(), &db.tables, "shipping", shipping.clone());
    let stop = CancellationToken::new();
    let (broker_url, settings, system, running, cleanup): (_, _, _, _, BoxFuture<'static, ()>) =
        match broker {
            Broker::Nats => {
                let stream = unique("S");
                let reader = NatsReader::start(NATS_URL, &stream, &prefix).await;
                let consumer = NatsConsumer::connect(
                    NatsSource::new(NATS_URL, &stream),
                    ConsumerConfig::new("shipping"),
                    processor,
                )
                .await
                .unwrap();
                (
                    NATS_URL,
                    format!("[nats]\nstream = \"{stream}\""),
                    "nats",
                    tokio::spawn(consumer.run(stop.clone())),
                    Box::pin(reader.cleanup()),
                )
            }
            Broker::Rabbitmq => {
                let exchange = unique("x");
                let queue = RabbitReader::declare_only(&exchange, "#").await;
                let consumer = RabbitMqConsumer::connect(
                    RabbitMqSource::new(RABBITMQ_URL, &queue.queue),
                    ConsumerConfig::new("shipping"),
                    processor,
                )
                .await
                .unwrap();
                (
                    RABBITMQ_URL,
                    format!("[rabbitmq]\nexchange = \"{exchange}\""),
                    "rabbitmq",
                    tokio::spawn(consumer.run(stop.clone())),
                    Box::pin(queue.cleanup()),
                )
            }
        };

    let mode = if cdc {
        WriteMode::WalOnly
    } else {
        WriteMode::Table
    };
    let trace = place_order(&db, mode).await;
    let config = fast_config(&prefix, &settings);
    let mut env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "outbox-relay"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    if cdc {
        env.push(("OUTBOX_RELAY__MODE", "cdc"));
    }
    let mut relay = RelayProcess::start_with_env(&db, broker_url, &config, "127.0.0.1:0", &env);
    check_one_trace(&receiver, &trace, system).await;
    assert_eq!(shipping.seen.lock().unwrap().clone(), vec![trace.clone()]);
    assert_eq!(
        command_trace(&db).await,
        trace,
        "the command carries the trace on"
    );

    assert!(relay.terminate(), "clean exit:\n{}", relay.log());
    stop.cancel();
    running.await.unwrap().unwrap();
    cleanup.await;
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn one_trace_from_writer_through_the_relay_to_a_nats_consumer() {
    one_trace(Broker::Nats, false).await;
}

#[tokio::test]
async fn one_trace_from_writer_through_the_relay_to_a_rabbitmq_consumer() {
    one_trace(Broker::Rabbitmq, false).await;
}

#[tokio::test]
async fn one_trace_through_the_cdc_relay_from_a_table_less_write() {
    one_trace(Broker::Nats, true).await;
}
