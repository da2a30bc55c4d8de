//! (n) `consumer`: what applying each event once, in its aggregate's order, costs the
//! consumer's side. The harness publishes `--events` messages as the relay would (its headers,
//! `--aggregates` aggregates, each aggregate's versions in order) to a JetStream stream of its
//! own (`--broker nats`) or a RabbitMQ queue of its own (`--broker rabbitmq`), then drains them
//! through `outbox-consumer`'s runner for that broker in this process: inbox on,
//! version gate from version 1, a handler that does nothing, one transaction per event,
//! `--consumer-concurrency` aggregates at once. Its floor, measured in the same run on the same
//! server: as many one-row `INSERT`s, each its own transaction (autocommit: one round trip,
//! one commit), from as many connections as the runner applies events at once. The ratio is
//! the runner's rate over the floor's; CPU per event is given for each process (the harness is
//! the runner in the second phase, the inserting client in the first).

use std::{
    fmt::Write,
    str::FromStr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use async_nats::{jetstream::message::PublishMessage, HeaderMap};
use futures::{future::BoxFuture, stream::FuturesUnordered, StreamExt};
use lapin::{
    options::BasicPublishOptions,
    types::{AMQPValue, FieldTable},
    BasicProperties,
};
use outbox_consumer::{
    kafka::{KafkaConsumer, KafkaSource},
    nats::{NatsConsumer, NatsSource},
    rabbitmq::{RabbitMqConsumer, RabbitMqSource},
    ConsumerConfig, Count, Envelope, Handler, HandlerError, Processor, VersionGate,
};
use rdkafka::{
    message::{Header, OwnedHeaders},
    producer::{FutureProducer, FutureRecord},
    ClientConfig,
};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgConnection, PgPool,
};
use tokio_util::sync::CancellationToken;

use crate::{
    common::{interruptible, payload, Result, Scope},
    context::Bench,
    cost::{Cpu, Meter},
    Broker,
};

/// The consumer's name (its durable on the stream, its rows in the consumer tables).
const NAME: &str = "bench";

/// Figures of both phases.
#[derive(Clone, Debug)]
pub struct ConsumerResult {
    /// Aggregates the events spread over.
    pub aggregates: u64,
    /// Connections of the floor, aggregates applied at once by the runner.
    pub concurrency: usize,
    /// The floor: one-row autocommit inserts.
    pub floor: Cpu,
    /// The runner.
    pub runner: Cpu,
    /// Events the runner held for their turn at least once (0 when each came in order).
    pub held: u64,
}

/// A handler that does nothing: what is left is the runner, the inbox and the gate.
struct Nothing;

impl Handler for Nothing {
    fn handle<'a>(
        &'a self,
        _tx: &'a mut PgConnection,
        _event: &'a Envelope,
    ) -> BoxFuture<'a, std::result::Result<(), HandlerError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Runs both phases in a schema and on a stream or queue of their own, removed afterwards.
pub async fn run(bench: &Bench) -> Result<ConsumerResult> {
    let scope = bench.scope("consumer")?;
    bench.create_outbox(&scope).await?;
    let broker = bench.broker_of(&scope);
    match broker {
        Broker::Nats => bench.create_stream(&scope).await?,
        Broker::Rabbitmq => bench.rabbitmq()?.create(&scope.stream).await?,
        Broker::Kafka => {
            let kafka = bench.kafka()?;
            kafka
                .create_topic(&scope.topic, bench.options.kafka_partitions)
                .await?;
            kafka.create_topic(&dead_topic(&scope), 1).await?;
        }
    }
    let result = interruptible(measure(bench, &scope)).await;
    match broker {
        Broker::Rabbitmq => {
            let rabbitmq = bench.rabbitmq()?;
            rabbitmq.delete(&scope.stream).await;
            rabbitmq
                .delete_queue(&format!("{}.dead", queue(&scope)))
                .await;
        }
        Broker::Kafka => {
            let kafka = bench.kafka()?;
            let _ = kafka.delete_topic(&scope.topic).await;
            let _ = kafka.delete_topic(&dead_topic(&scope)).await;
        }
        Broker::Nats => {
            let js = bench.js()?;
            let _ = js.delete_stream(&scope.stream).await;
            let _ = js
                .delete_stream(format!("{}_DEAD_{NAME}", scope.stream))
                .await;
        }
    }
    bench.cleanup_schema(&scope).await;
    result
}

/// The Kafka runner's dead-letter topic, of this run alone.
fn dead_topic(scope: &Scope) -> String {
    format!("{}.dead", scope.subjects)
}

/// The RabbitMQ queue the runner consumes: the one `RabbitAdmin::create` bound to the
/// scenario's exchange.
fn queue(scope: &Scope) -> String {
    crate::rabbitmq::RabbitAdmin::queue(&scope.stream)
}

async fn measure(bench: &Bench, scope: &Scope) -> Result<ConsumerResult> {
    let events = bench.options.events;
    let concurrency = bench.options.consumer_concurrency;
    let pool = PgPoolOptions::new()
        .max_connections(concurrency as u32 + 4)
        .acquire_timeout(Duration::from_secs(30))
        .test_before_acquire(false)
        .connect_with(
            PgConnectOptions::from_str(&bench.options.database_url)?
                .application_name("outbox-bench-consumer"),
        )
        .await?;
    publish(bench, scope, events).await?;
    bench.settle("consumer").await;
    let floor = insert_floor(bench, scope, &pool, events, concurrency).await?;
    bench.log(
        "consumer",
        format!("floor: {events} one-row inserts ({:.0}/s)", floor.rate()),
    );
    bench.settle("consumer").await;
    let (runner, held) = drain(bench, scope, &pool, events, concurrency).await?;
    bench.log(
        "consumer",
        format!(
            "runner: {events} events applied ({:.0}/s, {:.2} of the floor)",
            runner.rate(),
            runner.rate() / floor.rate().max(1e-9)
        ),
    );
    pool.close().await;
    Ok(ConsumerResult {
        aggregates: bench.options.aggregates,
        concurrency,
        floor,
        runner,
        held,
    })
}

/// Publishes `events` messages as the relay would, version `n / aggregates + 1` of aggregate
/// `n % aggregates` for the n-th, in order, each confirmed by the broker.
async fn publish(bench: &Bench, scope: &Scope, events: u64) -> Result<()> {
    let aggregates = bench.options.aggregates.max(1);
    let window = (bench.options.inflight * bench.options.batch_size as usize).max(1);
    let body = bytes::Bytes::from(serde_json::to_vec(&payload(1))?);
    let occurred_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let sender = Sender::open(bench, scope).await?;
    bench.log("consumer", format!("publishing {events} messages"));
    let mut pending = FuturesUnordered::new();
    for n in 0..events {
        while pending.len() >= window {
            if let Some(result) = pending.next().await {
                result?;
            }
        }
        let id = uuid::Uuid::now_v7().to_string();
        let aggregate = format!("agg-{}", n % aggregates);
        let headers = [
            ("event-id", id.clone()),
            ("event-type", "OrderPlaced".into()),
            ("schema-version", "1".into()),
            ("aggregate-type", "order".into()),
            ("aggregate-id", aggregate.clone()),
            ("aggregate-version", (n / aggregates + 1).to_string()),
            ("occurred-at", occurred_at.clone()),
            ("content-type", "application/json".into()),
        ];
        pending.push(sender.send(id, aggregate, headers, body.clone()));
    }
    while let Some(result) = pending.next().await {
        result?;
    }
    Ok(())
}

/// Where the harness publishes: the scenario's JetStream subjects or RabbitMQ exchange.
enum Sender {
    Nats {
        js: async_nats::jetstream::Context,
        subject: String,
    },
    Rabbitmq {
        _connection: lapin::Connection,
        channel: lapin::Channel,
        exchange: String,
    },
    Kafka {
        producer: FutureProducer,
        topic: String,
    },
}

impl Sender {
    async fn open(bench: &Bench, scope: &Scope) -> Result<Self> {
        Ok(match bench.broker_of(scope) {
            Broker::Rabbitmq => {
                let connection = lapin::Connection::connect(
                    &bench.options.rabbitmq_url,
                    lapin::ConnectionProperties::default(),
                )
                .await?;
                let channel = connection.create_channel().await?;
                channel
                    .confirm_select(lapin::options::ConfirmSelectOptions::default())
                    .await?;
                Self::Rabbitmq {
                    _connection: connection,
                    channel,
                    exchange: scope.stream.clone(),
                }
            }
            Broker::Kafka => Self::Kafka {
                producer: ClientConfig::new()
                    .set("bootstrap.servers", &bench.options.kafka_brokers)
                    .set("enable.idempotence", "true")
                    .set("acks", "all")
                    // One record per batch: tansu 0.6.0 answers a fetch from inside a batch
                    // with nothing, and the runner's pause and resume fetch from there.
                    .set("batch.num.messages", "1")
                    .create()
                    .map_err(|e| format!("kafka producer: {e}"))?,
                topic: scope.topic.clone(),
            },
            Broker::Nats => Self::Nats {
                js: bench.js()?.clone(),
                subject: format!("{}.order.OrderPlaced", scope.subjects),
            },
        })
    }

    /// Sends one message of `aggregate` and waits for the broker's confirmation.
    fn send(
        &self,
        id: String,
        aggregate: String,
        headers: [(&'static str, String); 8],
        body: bytes::Bytes,
    ) -> BoxFuture<'static, Result<()>> {
        match self {
            Self::Nats { js, subject } => {
                let mut map = HeaderMap::new();
                for (name, value) in &headers {
                    map.insert(*name, value.as_str());
                }
                let message = PublishMessage::build()
                    .payload(body)
                    .headers(map)
                    .message_id(id.as_str());
                let (js, subject) = (js.clone(), subject.clone());
                Box::pin(async move {
                    let ack = js.send_publish(subject, message).await?;
                    std::future::IntoFuture::into_future(ack).await?;
                    Ok(())
                })
            }
            Self::Rabbitmq {
                channel, exchange, ..
            } => {
                let mut table = FieldTable::default();
                for (name, value) in headers {
                    table.insert(name.into(), AMQPValue::LongString(value.into()));
                }
                let properties = BasicProperties::default()
                    .with_headers(table)
                    .with_message_id(id.into())
                    .with_delivery_mode(2);
                let (channel, exchange) = (channel.clone(), exchange.clone());
                Box::pin(async move {
                    let confirm = channel
                        .basic_publish(
                            &exchange,
                            "order.OrderPlaced",
                            BasicPublishOptions::default(),
                            &body,
                            properties,
                        )
                        .await?
                        .await?;
                    if !confirm.is_ack() {
                        return Err(format!("RabbitMQ refused a message: {confirm:?}").into());
                    }
                    Ok(())
                })
            }
            Self::Kafka { producer, topic } => {
                let (producer, topic) = (producer.clone(), topic.clone());
                Box::pin(async move {
                    let mut map = OwnedHeaders::new();
                    for (name, value) in &headers {
                        map = map.insert(Header {
                            key: name,
                            value: Some(value.as_str()),
                        });
                    }
                    // Keyed by aggregate, as the relay keys them: one partition per aggregate.
                    let record = FutureRecord::to(&topic)
                        .key(&aggregate)
                        .headers(map)
                        .payload(body.as_ref());
                    producer
                        .send(record, Duration::from_secs(30))
                        .await
                        .map_err(|(e, _)| format!("kafka: {e}"))?;
                    Ok(())
                })
            }
        }
    }
}

/// The floor: `events` one-row autocommit inserts from `concurrency` connections.
async fn insert_floor(
    bench: &Bench,
    scope: &Scope,
    pool: &PgPool,
    events: u64,
    concurrency: usize,
) -> Result<Cpu> {
    sqlx::raw_sql(&scope.tables.render(
        "CREATE TABLE {schema}.floor (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
         event_id uuid NOT NULL, aggregate_id text NOT NULL, version bigint NOT NULL)",
    ))
    .execute(pool)
    .await?;
    let insert = scope
        .tables
        .render("INSERT INTO {schema}.floor (event_id, aggregate_id, version) VALUES ($1, $2, $3)");
    let aggregates = bench.options.aggregates.max(1);
    let next = Arc::new(AtomicU64::new(0));
    let meter = Meter::start(bench.processes(scope).await?);
    let mut clients = Vec::new();
    for _ in 0..concurrency {
        let (pool, insert, next) = (pool.clone(), insert.clone(), next.clone());
        clients.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= events {
                    return Ok::<(), sqlx::Error>(());
                }
                sqlx::query(&insert)
                    .bind(uuid::Uuid::now_v7())
                    .bind(format!("agg-{}", n % aggregates))
                    .bind((n / aggregates + 1) as i64)
                    .execute(&mut *conn)
                    .await?;
            }
        }));
    }
    for client in clients {
        client.await??;
    }
    Ok(meter.stop(events))
}

/// Drains the stream through the NATS runner until it applied `events` events; returns its
/// figures and how many events it held for their turn.
async fn drain(
    bench: &Bench,
    scope: &Scope,
    pool: &PgPool,
    events: u64,
    concurrency: usize,
) -> Result<(Cpu, u64)> {
    let processor = Processor::new(pool.clone(), &scope.tables, NAME, Arc::new(Nothing))
        .with_version_gate(VersionGate::starting_at(1));
    let metrics = processor.metrics().clone();
    let config = ConsumerConfig {
        concurrency,
        ..ConsumerConfig::new(NAME)
    };
    let meter = Meter::start(bench.processes(scope).await?);
    let stop = CancellationToken::new();
    let task = match bench.broker_of(scope) {
        Broker::Rabbitmq => {
            let source = RabbitMqSource {
                // As many messages in hand as the NATS runner's durable allows.
                prefetch: u16::try_from(config.max_in_hand).unwrap_or(u16::MAX),
                ..RabbitMqSource::new(&bench.options.rabbitmq_url, queue(scope))
            };
            let consumer = RabbitMqConsumer::connect(source, config, processor).await?;
            tokio::spawn(consumer.run(stop.clone()))
        }
        Broker::Kafka => {
            let source = KafkaSource {
                group_id: Some(scope.stream.clone()),
                dead_letter_topic: Some(dead_topic(scope)),
                ..KafkaSource::new(&bench.options.kafka_brokers, &[scope.topic.as_str()])
            };
            let consumer = KafkaConsumer::connect(source, config, processor).await?;
            tokio::spawn(consumer.run(stop.clone()))
        }
        Broker::Nats => {
            let source = NatsSource::new(&bench.options.nats_url, &scope.stream);
            let consumer = NatsConsumer::connect(source, config, processor).await?;
            tokio::spawn(consumer.run(stop.clone()))
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(bench.options.drain_timeout);
    let mut last_log = std::time::Instant::now();
    loop {
        let handled = metrics.count(NAME, Count::Handled);
        if handled >= events {
            break;
        }
        let dead = metrics.count(NAME, Count::DeadLettered);
        if dead > 0 || task.is_finished() {
            stop.cancel();
            let ended = task.await?;
            return Err(format!(
                "the runner stopped or dead-lettered after {handled} events \
                 ({dead} dead letters): {ended:?}"
            )
            .into());
        }
        if std::time::Instant::now() > deadline {
            stop.cancel();
            return Err(format!("{handled} of {events} applied at the deadline").into());
        }
        if last_log.elapsed() > Duration::from_secs(10) {
            bench.log("consumer", format!("{handled} of {events} applied"));
            last_log = std::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpu = meter.stop(events);
    stop.cancel();
    task.await??;
    Ok((cpu, metrics.count(NAME, Count::Held)))
}

/// The results table.
pub fn render(r: &ConsumerResult) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{} events over {} aggregates; {} connections (floor) and aggregates at once (runner).\n",
        r.runner.events, r.aggregates, r.concurrency
    );
    let broker = r
        .runner
        .broker
        .as_ref()
        .map_or("broker", |(name, _)| name.as_str());
    let _ = writeln!(
        text,
        "| phase | events/s | ratio | wall s | harness µs/event | PostgreSQL µs/event | \
         {broker} µs/event | machine µs/event |"
    );
    let _ = writeln!(
        text,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for (phase, cpu) in [
        ("floor: one-row autocommit INSERT", &r.floor),
        ("runner: inbox + gate + no-op handler", &r.runner),
    ] {
        let _ = writeln!(
            text,
            "| {phase} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            cpu.rate(),
            cpu.rate() / r.floor.rate().max(1e-9),
            cpu.wall.as_secs_f64(),
            cpu.per_event(cpu.harness),
            cpu.per_event(cpu.postgres.unwrap_or(0.0)),
            cpu.per_event(cpu.broker.as_ref().map_or(0.0, |b| b.1)),
            cpu.per_event(cpu.machine),
        );
    }
    let _ = writeln!(
        text,
        "\nEvents held for their turn by the runner: {}.",
        r.held
    );
    text
}
