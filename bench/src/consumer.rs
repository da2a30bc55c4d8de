//! (n) `consumer`: what applying each event once, in its aggregate's order, costs the
//! consumer's side. The harness publishes `--events` messages to a JetStream stream of its own
//! as the relay would (its headers, `--aggregates` aggregates, each aggregate's versions in
//! order), then drains them through `outbox-consumer`'s NATS runner in this process: inbox on,
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
use outbox_consumer::{
    nats::{NatsConsumer, NatsSource},
    ConsumerConfig, Count, Envelope, Handler, HandlerError, Processor, VersionGate,
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

/// Runs both phases in a schema and on streams of their own, removed afterwards.
pub async fn run(bench: &Bench) -> Result<ConsumerResult> {
    let scope = bench.scope("consumer")?;
    bench.create_outbox(&scope).await?;
    bench.create_stream(&scope).await?;
    let result = interruptible(measure(bench, &scope)).await;
    let js = bench.js()?;
    let _ = js.delete_stream(&scope.stream).await;
    let _ = js
        .delete_stream(format!("{}_DEAD_{NAME}", scope.stream))
        .await;
    bench.cleanup_schema(&scope).await;
    result
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
/// `n % aggregates` for the n-th, in order.
async fn publish(bench: &Bench, scope: &Scope, events: u64) -> Result<()> {
    let js = bench.js()?.clone();
    let aggregates = bench.options.aggregates.max(1);
    let window = (bench.options.inflight * bench.options.batch_size as usize).max(1);
    let body = bytes::Bytes::from(serde_json::to_vec(&payload(1))?);
    let subject = format!("{}.order.OrderPlaced", scope.subjects);
    let occurred_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    bench.log("consumer", format!("publishing {events} messages"));
    let mut pending = FuturesUnordered::new();
    for n in 0..events {
        while pending.len() >= window {
            if let Some(result) = pending.next().await {
                result?;
            }
        }
        let id = uuid::Uuid::now_v7().to_string();
        let mut headers = HeaderMap::new();
        headers.insert("event-id", id.as_str());
        headers.insert("event-type", "OrderPlaced");
        headers.insert("schema-version", "1");
        headers.insert("aggregate-type", "order");
        headers.insert("aggregate-id", format!("agg-{}", n % aggregates).as_str());
        headers.insert(
            "aggregate-version",
            (n / aggregates + 1).to_string().as_str(),
        );
        headers.insert("occurred-at", occurred_at.as_str());
        headers.insert("content-type", "application/json");
        let message = PublishMessage::build()
            .payload(body.clone())
            .headers(headers)
            .message_id(id.as_str());
        let js = js.clone();
        let subject = subject.clone();
        pending.push(async move {
            let ack = js.send_publish(subject, message).await?;
            std::future::IntoFuture::into_future(ack).await?;
            Ok::<(), crate::common::BoxError>(())
        });
    }
    while let Some(result) = pending.next().await {
        result?;
    }
    Ok(())
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
    let consumer = NatsConsumer::connect(
        NatsSource::new(&bench.options.nats_url, &scope.stream),
        config,
        processor,
    )
    .await?;
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
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
    let _ = writeln!(
        text,
        "| phase | events/s | ratio | wall s | harness µs/event | PostgreSQL µs/event | \
         nats-server µs/event | machine µs/event |"
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
