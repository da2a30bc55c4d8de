//! A whole run: schema, broker, relays, the services as consumers, orders, crashes, the report.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use outbox::{
    postgres::{MigrateOptions, PgOutbox},
    Outbox, Tables,
};
use outbox_consumer::{saga::SagaHandler, ConsumerConfig, Handler, Processor};
use outbox_relayer::{Relay, RelayHandle};
use rand::{rngs::StdRng, Rng, SeedableRng};
use sqlx::{postgres::PgPoolOptions, PgPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    faults::{DatabaseRestart, FailingSteps, FlakyTimeouts},
    report::Report,
    saga::OrderSaga,
    services::{cancel_overdue, Service, ServiceHandler},
    ticket::{install, place_order, Mode},
};
use crate::{brokers::Broker, relay_config, BoxError};

/// What to run.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// PostgreSQL URL.
    pub database_url: String,
    /// `nats://…` or `amqp://…`.
    pub broker_url: String,
    /// Orchestrated or choreographed.
    pub mode: Mode,
    /// Orders to place.
    pub orders: u32,
    /// Inject crashes: kill relays and consumers abruptly, fail steps after their writes.
    pub crashes: bool,
    /// How long the inventory may take before the order is given up.
    pub inventory_timeout: Duration,
    /// Seed of the crash schedule.
    pub seed: u64,
    /// Give up waiting for the orders to settle after this long.
    pub patience: Duration,
    /// Orchestrated, with crashes on: the first timeout step of each order fails (and is
    /// retried after the scheduler's backoff).
    pub failing_timeouts: bool,
    /// Restart the database once, a third of the way through the orders.
    pub restart_database: Option<DatabaseRestart>,
}

impl Scenario {
    /// A run of `orders` orders in `mode`, crashes on, seed 1.
    pub fn new(database_url: &str, broker_url: &str, mode: Mode, orders: u32) -> Self {
        Self {
            database_url: database_url.into(),
            broker_url: broker_url.into(),
            mode,
            orders,
            crashes: true,
            inventory_timeout: Duration::from_secs(10),
            seed: 1,
            patience: Duration::from_secs(180),
            failing_timeouts: true,
            restart_database: None,
        }
    }
}

/// Runs the scenario in a schema and stream or exchange of its own, removed at the end.
pub async fn run(s: &Scenario) -> Result<Report, BoxError> {
    let pool = PgPoolOptions::new()
        .max_connections(24)
        // Relays and consumers are killed by aborting their tasks, in their transactions.
        .after_release(|conn, _| Box::pin(outbox::postgres::outside_transaction(conn)))
        .connect(&s.database_url)
        .await?;
    let schema = format!("saga_{:08x}", rand::random::<u32>());
    let tables = Tables::new(&schema, "events")?;
    let result = play(s, &pool, &tables).await;
    let _ = sqlx::raw_sql(&tables.render("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&pool)
        .await;
    result
}

struct Consumer {
    name: String,
    handler: Arc<dyn Handler>,
    task: Option<JoinHandle<()>>,
}

async fn play(s: &Scenario, pool: &PgPool, tables: &Tables) -> Result<Report, BoxError> {
    let outbox = PgOutbox::new(tables.clone());
    outbox
        .migrate(
            pool,
            MigrateOptions {
                partitions: Some(8),
                ..Default::default()
            },
        )
        .await?;
    install(pool, tables).await?;
    let failed_steps = Arc::new(AtomicU64::new(0));
    let failing = |inner: Arc<dyn Handler>, seed: u64| -> Arc<dyn Handler> {
        Arc::new(FailingSteps {
            inner,
            rate: if s.crashes { 0.05 } else { 0.0 },
            seed,
            calls: AtomicU64::new(0),
            failed: failed_steps.clone(),
        })
    };
    let timeout_failures = Arc::new(AtomicU64::new(0));
    let saga = Arc::new(SagaHandler::new(
        FlakyTimeouts {
            saga: OrderSaga {
                inventory_timeout: s.inventory_timeout,
            },
            enabled: s.crashes && s.failing_timeouts,
            failed_once: Default::default(),
            failures: timeout_failures.clone(),
        },
        tables,
    ));
    let mut consumers: Vec<Consumer> = Service::ALL
        .iter()
        .enumerate()
        .map(|(i, service)| Consumer {
            name: service.name().to_owned(),
            handler: failing(
                Arc::new(ServiceHandler::new(*service, s.mode, tables)),
                s.seed + i as u64,
            ),
            task: None,
        })
        .collect();
    if s.mode == Mode::Orchestrated {
        consumers.push(Consumer {
            name: "order-saga".into(),
            handler: failing(saga.clone(), s.seed + 99),
            task: None,
        });
    }
    let names: Vec<&str> = consumers.iter().map(|c| c.name.as_str()).collect();
    let broker = Broker::set_up(&s.broker_url, tables, &names).await?;
    let stop = CancellationToken::new();
    let start = |c: &Consumer| {
        let processor = Processor::new(pool.clone(), tables, &c.name, c.handler.clone());
        let config = ConsumerConfig {
            max_attempts: 1_000,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(500),
            ..ConsumerConfig::new(&c.name)
        };
        broker.start_consumer(processor, config, Duration::from_secs(1), stop.clone())
    };
    for c in &mut consumers {
        c.task = Some(start(c).await?);
    }

    // The timeouts: the saga's deadlines, or the order service's sweeper.
    let timeouts_fired = Arc::new(AtomicU64::new(0));
    let deadlines = {
        let (stop, pool, tables, fired) = (
            stop.clone(),
            pool.clone(),
            tables.clone(),
            timeouts_fired.clone(),
        );
        let timeouts = saga
            .timeouts(pool.clone())
            .interval(Duration::from_millis(200));
        let mode = s.mode;
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let round = match mode {
                    Mode::Orchestrated => timeouts.fire_due().await,
                    Mode::Choreographed => cancel_overdue(&pool, &tables).await,
                };
                match round {
                    Ok(n) => {
                        fired.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e) => eprintln!("timeouts: {e}"),
                }
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        })
    };

    let config = relay_config(tables);
    let start_relay = |n: u32| {
        let config = outbox_relayer::RelayConfig {
            relay_id: Some(format!("saga-relay-{n}")),
            ..config.clone()
        };
        let (pool, publisher) = (pool.clone(), broker.publisher());
        async move {
            let publisher = publisher.await?;
            // Retried while the database restarts.
            let mut tries = 0;
            loop {
                match Relay::builder(pool.clone(), publisher.clone(), config.clone())
                    .build()
                    .await
                {
                    Ok(relay) => return Ok::<RelayHandle, BoxError>(relay.spawn()),
                    Err(e) if tries < 100 => {
                        tries += 1;
                        eprintln!("relay start failed (retrying): {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    };

    let started = Instant::now();
    let mut relay = Some(start_relay(0).await?);
    let writer = {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        let (orders, timeout) = (i64::from(s.orders), s.inventory_timeout.as_secs_f64());
        tokio::spawn(async move {
            // Customers arrive over a few seconds, so the crashes land mid-flow.
            for n in 0..orders {
                // A customer tries again while the database restarts.
                let mut tries = 0;
                while let Err(e) = place_order(&pool, &outbox, n, timeout).await {
                    tries += 1;
                    if tries > 200 {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            Ok::<(), BoxError>(())
        })
    };

    let mut rng = StdRng::seed_from_u64(s.seed);
    let (mut relay_kills, mut consumer_kills) = (0u32, 0u32);
    let mut next_relay_kill =
        Instant::now() + Duration::from_millis(rng.random_range(2_000..5_000));
    let mut next_consumer_kill =
        Instant::now() + Duration::from_millis(rng.random_range(500..1_500));
    let deadline = Instant::now() + s.patience;
    let mut database_restarts = 0u32;
    let restart_after = i64::from(s.orders / 3);
    loop {
        let done = writer.is_finished()
            && settled(pool, tables, s.mode, consumers.len() as i64)
                .await
                .unwrap_or(false);
        if done {
            break;
        }
        if let Some(restart) = s
            .restart_database
            .as_ref()
            .filter(|_| database_restarts == 0)
        {
            if placed(pool, tables).await.unwrap_or(0) >= restart_after {
                (restart.0)().await;
                database_restarts += 1;
            }
        }
        if Instant::now() > deadline {
            eprintln!("order fulfilment: gave up waiting after {:?}", s.patience);
            if let Ok(why) = unsettled(pool, tables).await {
                eprintln!("order fulfilment: still open: {why}");
            }
            break;
        }
        let more_crashes = !writer.is_finished() || relay_kills < 3 || consumer_kills < 8;
        if s.crashes && more_crashes {
            if Instant::now() >= next_relay_kill {
                relay.take().expect("a relay runs").abort();
                relay_kills += 1;
                relay = Some(start_relay(relay_kills).await?);
                next_relay_kill =
                    Instant::now() + Duration::from_millis(rng.random_range(2_000..5_000));
            }
            if Instant::now() >= next_consumer_kill {
                let victim = rng.random_range(0..consumers.len());
                let c = &mut consumers[victim];
                c.task.take().expect("a consumer runs").abort();
                consumer_kills += 1;
                c.task = Some(start(c).await?);
                next_consumer_kill =
                    Instant::now() + Duration::from_millis(rng.random_range(500..1_500));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    writer.await??;
    if let Some(relay) = relay {
        relay.shutdown().await?;
    }
    stop.cancel();
    let _ = deadlines.await;
    for c in &mut consumers {
        if let Some(task) = c.task.take() {
            let _ = task.await;
        }
    }
    let fired = match s.mode {
        Mode::Orchestrated => None,
        Mode::Choreographed => Some(timeouts_fired.load(Ordering::Relaxed) as i64),
    };
    let mut report = Report::collect(pool, tables, s.mode, fired).await?;
    report.relay_kills = relay_kills;
    report.consumer_kills = consumer_kills;
    report.failed_steps = failed_steps.load(Ordering::Relaxed);
    report.timeout_step_failures = timeout_failures.load(Ordering::Relaxed);
    report.database_restarts = database_restarts;
    report.elapsed = elapsed;
    broker.clean_up().await;
    Ok(report)
}

/// Orders placed so far.
async fn placed(pool: &PgPool, tables: &Tables) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(&tables.render("SELECT count(*) FROM {schema}.orders"))
        .fetch_one(pool)
        .await
}

/// Every order completed or cancelled (and, orchestrated, every saga finished), every event
/// published, and every consumer through every event (each records every event it receives in
/// its inbox, the ones it ignores too).
/// What keeps a run from settling, in words: per consumer, the events its inbox lacks (the
/// first few), and what it holds.
async fn unsettled(pool: &PgPool, tables: &Tables) -> Result<String, sqlx::Error> {
    let missing: Vec<(String, i64, Vec<String>)> = sqlx::query_as(&tables.render(
        "SELECT c.consumer, count(*), (array_agg(e.event_type || ' ' || e.aggregate_id || ' ' \
                 || e.event_id::text ORDER BY e.id))[1:3] \
         FROM (SELECT DISTINCT consumer FROM {schema}.inbox) c \
         CROSS JOIN {schema}.{events} e \
         WHERE NOT EXISTS (SELECT 1 FROM {schema}.inbox i \
                           WHERE i.consumer = c.consumer AND i.event_id = e.event_id::text) \
         GROUP BY c.consumer",
    ))
    .fetch_all(pool)
    .await?;
    let held: Vec<(String, i64)> = sqlx::query_as(
        &tables.render("SELECT consumer, count(*) FROM {schema}.consumer_held GROUP BY consumer"),
    )
    .fetch_all(pool)
    .await?;
    Ok(format!("not in the inbox: {missing:?}; held: {held:?}"))
}

async fn settled(
    pool: &PgPool,
    tables: &Tables,
    mode: Mode,
    consumers: i64,
) -> Result<bool, sqlx::Error> {
    let saga_open = match mode {
        Mode::Orchestrated => "(SELECT count(*) FROM {schema}.sagas WHERE NOT finished)",
        Mode::Choreographed => "0",
    };
    let open: i64 = sqlx::query_scalar(&tables.render(&format!(
        "SELECT (SELECT count(*) FROM {{schema}}.orders \
                 WHERE status NOT IN ('completed', 'cancelled')) \
              + (SELECT count(*) FROM {{schema}}.{{events}} WHERE status <> 'published') \
              + {saga_open} \
              + (SELECT count(*) FROM {{schema}}.{{events}}) * $1 \
              - (SELECT count(*) FROM {{schema}}.inbox)"
    )))
    .bind(consumers)
    .fetch_one(pool)
    .await?;
    Ok(open == 0)
}
