//! The consumer side under seeded faults, on the real PostgreSQL and the real code: the
//! `Processor` (inbox, version gate, handler, commit) and a saga (`SagaHandler` and its
//! timeouts), fed by a simulated broker whose every choice a seed makes.
//!
//! Each round the broker hands a few deliveries to workers at once, each with a fault drawn
//! from the seed: a crash at a random await point of the step (the future dropped mid-
//! transaction), an ack lost after the commit (the message comes again), the same message
//! delivered twice at once, the database connections killed under the step, a handler error
//! or panic. Unacknowledged messages come back in any order; failing ones are dead-lettered
//! after 4 attempts and replayed by the "operator" at random rounds; saga timeouts fire at
//! random rounds, racing the payments. Then the faults stop, everything left is delivered, and
//! the oracle reads the database:
//!
//! - every ledger event applied exactly once, each aggregate's versions in order;
//! - every order's saga finished, `TakePayment` sent once, a cancellation (`CancelOrder`) at
//!   most once and only for a cancelled order, a refund exactly when a cancelled order was
//!   paid; never both paid and cancelled.
//!
//! `OUTBOX_CONSUMER_SIM_SEEDS` sets the number of seeds (default 16). Counts go to stderr, past
//! the harness's capture, so CI logs show them.

mod common;

use common::held_rows;
use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    io::Write,
    str::FromStr,
    sync::Arc,
    task::Poll,
    time::Duration,
};

use bytes::Bytes;
use futures::future::{join_all, BoxFuture};
use outbox::Event;
use outbox_consumer::{
    saga::{Saga, SagaHandler, SagaTimeouts, Start, Step, Trigger, TIMEOUT},
    ConsumerConfig, DeadLetters, Envelope, Handler, HandlerError, Message, Outcome, Processor,
    VersionGate,
};
use outbox_testkit::{database_url, wait_until, TestDb};
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgConnection, PgPool,
};
use uuid::Uuid;

const AGGREGATES: usize = 6;
const VERSIONS: i64 = 5;
const ORDERS: usize = 6;
const WORKERS: usize = 4;
const MAX_ATTEMPTS: u32 = 4;

/// Records each event it applies in `ledger` (identity column: the order of application);
/// fails or panics when the delivery's `sim-fault` header says so.
struct Ledger {
    sql: String,
}

impl Handler for Ledger {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            sqlx::query(&self.sql)
                .bind(event.event_id)
                .bind(event.aggregate_id.as_deref())
                .bind(event.aggregate_version)
                .execute(&mut *tx)
                .await?;
            match event.headers.get("sim-fault").map(String::as_str) {
                Some("error") => Err(HandlerError::new("simulated handler error")),
                Some("panic") => panic!("simulated handler panic"),
                _ => Ok(()),
            }
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum State {
    AwaitingPayment,
    Paid,
    Cancelled,
}

#[derive(Serialize, Deserialize)]
struct Order {
    id: String,
}

/// Placed → awaiting payment → paid, or cancelled at the deadline (a payment after that is
/// refunded).
struct Checkout;

impl Saga for Checkout {
    type State = State;
    type Data = Order;

    fn name(&self) -> &str {
        "checkout-sim"
    }

    fn reacts_to(&self) -> &[&str] {
        &["OrderPlaced", "PaymentTaken"]
    }

    fn correlate(&self, event: &Envelope) -> Option<String> {
        event.aggregate_id.clone()
    }

    fn start(&self, event: &Envelope) -> Result<Option<Start<State, Order>>, HandlerError> {
        if event.event_type != "OrderPlaced" {
            return Ok(None);
        }
        let id = event.aggregate_id.clone().unwrap_or_default();
        let take = Event::new("order", &id, "TakePayment");
        Ok(Some(
            Start::new(State::AwaitingPayment, Order { id }).emit(take),
        ))
    }

    fn react(
        &self,
        state: &State,
        order: &mut Order,
        on: &Trigger,
    ) -> Result<Step<State>, HandlerError> {
        use State::*;
        Ok(match (state, on.name()) {
            (_, "OrderPlaced") => Step::ignore("placed already"),
            (AwaitingPayment, "PaymentTaken") => Step::to(Paid),
            (Cancelled, "PaymentTaken") => Step::ignore("paid after the cancellation")
                .emit(Event::new("order", &order.id, "RefundPayment")),
            (AwaitingPayment, TIMEOUT) => {
                Step::to(Cancelled).emit(Event::new("order", &order.id, "CancelOrder"))
            }
            _ => Step::unexpected(format!("{} while {state:?}", on.name())),
        })
    }

    fn timeout(&self, state: &State) -> Option<Duration> {
        (*state == State::AwaitingPayment).then_some(Duration::from_millis(30))
    }

    fn is_final(&self, state: &State) -> bool {
        matches!(state, State::Paid | State::Cancelled)
    }
}

/// Which processor a message goes to.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    Ledger,
    Saga,
}

#[derive(Clone)]
struct Delivery {
    target: Target,
    event: Envelope,
    attempts: u32,
}

/// What a worker does with its delivery this round.
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// Dropped after this many polls.
    Crash(u32),
    /// Applied, but the ack is lost.
    LostAck,
    /// Delivered to two workers at once.
    Twice,
    /// The processor's connections are killed while it runs.
    Outage,
    /// The handler fails (ledger only).
    HandlerError,
    /// The handler panics (ledger only).
    HandlerPanic,
}

#[derive(Debug, Default)]
struct Counts {
    deliveries: u64,
    crashes: u64,
    lost_acks: u64,
    twice: u64,
    outages: u64,
    handler_faults: u64,
    out_of_order: u64,
    infrastructure: u64,
    failures: u64,
    dead_lettered: u64,
    replays: u64,
    timeout_rounds: u64,
    timeouts_fired: u64,
    /// Given-up events whose grace the simulation ended (their dead letter not yet stored).
    graces_ended: u64,
    /// The last errors of failed deliveries (for a failure's message).
    errors: Vec<String>,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.deliveries += other.deliveries;
        self.crashes += other.crashes;
        self.lost_acks += other.lost_acks;
        self.twice += other.twice;
        self.outages += other.outages;
        self.handler_faults += other.handler_faults;
        self.out_of_order += other.out_of_order;
        self.infrastructure += other.infrastructure;
        self.failures += other.failures;
        self.dead_lettered += other.dead_lettered;
        self.replays += other.replays;
        self.timeout_rounds += other.timeout_rounds;
        self.timeouts_fired += other.timeouts_fired;
        self.graces_ended += other.graces_ended;
        self.errors.extend(other.errors.iter().cloned());
        let keep = self.errors.len().saturating_sub(6);
        self.errors.drain(..keep);
    }
}

/// Dead letters of one sweep.
#[derive(Default)]
struct Letters(std::sync::Mutex<Vec<Message>>);

impl DeadLetters for Letters {
    fn dead_letter<'a>(
        &'a self,
        message: &'a Message,
        _reason: &'a str,
        _attempts: u32,
        _origin: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.0.lock().unwrap().push(message.clone());
            Ok(())
        })
    }
}

/// Runs `f`, or drops it after `polls` polls (a crash at that await point).
async fn run_or_crash<F: Future>(f: F, polls: Option<u32>) -> Option<F::Output> {
    let Some(limit) = polls else {
        return Some(f.await);
    };
    let mut f = std::pin::pin!(f);
    let mut n = 0;
    std::future::poll_fn(|cx| {
        n += 1;
        if n > limit {
            return Poll::Ready(None);
        }
        f.as_mut().poll(cx).map(Some)
    })
    .await
}

fn envelope(target_type: &str, aggregate: &str, version: Option<i64>) -> Envelope {
    let event_id = Uuid::now_v7();
    Envelope {
        event_id,
        message_id: event_id.to_string(),
        event_type: target_type.into(),
        schema_version: 1,
        aggregate_type: Some("order".into()),
        aggregate_id: Some(aggregate.into()),
        aggregate_version: version,
        occurred_at: None,
        copy_of_schema_version: None,
        destination: format!("order.{target_type}"),
        headers: Default::default(),
        payload: Bytes::from_static(b"{}"),
    }
}

struct World {
    db: TestDb,
    pool: PgPool,
    /// The processors' connections carry this application name, for the outage fault.
    app: String,
    ledger: Processor,
    saga: Processor,
    timeouts: SagaTimeouts<Checkout>,
    paid: HashMap<String, bool>,
    events: usize,
    /// How held events are retried (the runners' defaults, with short backoffs).
    config: ConsumerConfig,
}

impl World {
    async fn new(seed: u64, rng: &mut StdRng) -> (Self, VecDeque<Delivery>) {
        let db = TestDb::new(2).await;
        db.exec(
            "CREATE TABLE {schema}.ledger (n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 event_id uuid NOT NULL, aggregate_id text NOT NULL, version bigint NOT NULL)",
        )
        .await;
        let app = format!("consumer-sim-{seed}-{}", &db.schema);
        let options = PgConnectOptions::from_str(&database_url())
            .unwrap()
            .application_name(&app);
        // Crashes drop the processors' futures, `BEGIN` included: a connection released
        // inside a transaction sqlx does not know of is closed, as a service that drops
        // futures must do (`outbox::postgres::outside_transaction`, reliability.md bug 34).
        let pool: PgPool = PgPoolOptions::new()
            .max_connections(WORKERS as u32 + 2)
            .acquire_timeout(Duration::from_secs(2))
            .after_release(|conn, _| Box::pin(outbox::postgres::outside_transaction(conn)))
            .connect_with(options)
            .await
            .unwrap();
        let ledger = Processor::new(
            pool.clone(),
            &db.tables,
            "ledger",
            Arc::new(Ledger {
                sql: db.tables.render(
                    "INSERT INTO {schema}.ledger (event_id, aggregate_id, version) \
                     VALUES ($1, $2, $3)",
                ),
            }),
        )
        .with_version_gate(VersionGate::starting_at(1));
        let saga = Arc::new(SagaHandler::new(Checkout, &db.tables));
        let timeouts = saga.timeouts(pool.clone());
        let saga = Processor::new(pool.clone(), &db.tables, "checkout", saga);

        let mut deliveries = Vec::new();
        for a in 0..AGGREGATES {
            for version in 1..=VERSIONS {
                let event = envelope("OrderChanged", &format!("a{a}"), Some(version));
                deliveries.push(Delivery {
                    target: Target::Ledger,
                    event,
                    attempts: 0,
                });
            }
        }
        let events = deliveries.len();
        let mut paid = HashMap::new();
        for o in 0..ORDERS {
            let id = format!("o{o}");
            deliveries.push(Delivery {
                target: Target::Saga,
                event: envelope("OrderPlaced", &id, None),
                attempts: 0,
            });
            let pays = rng.random_bool(0.6);
            if pays {
                deliveries.push(Delivery {
                    target: Target::Saga,
                    event: envelope("PaymentTaken", &id, None),
                    attempts: 0,
                });
            }
            paid.insert(id, pays);
        }
        // The broker's own duplicates, then any order.
        let extra: Vec<Delivery> = deliveries
            .iter()
            .filter(|_| rng.random_bool(0.3))
            .cloned()
            .collect();
        deliveries.extend(extra);
        deliveries.shuffle(rng);
        let world = Self {
            db,
            pool,
            app,
            ledger,
            saga,
            timeouts,
            paid,
            events,
            config: ConsumerConfig {
                max_attempts: MAX_ATTEMPTS,
                initial_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(5),
                ..ConsumerConfig::new("sim")
            },
        };
        (world, deliveries.into())
    }

    fn processor(&self, target: Target) -> &Processor {
        match target {
            Target::Ledger => &self.ledger,
            Target::Saga => &self.saga,
        }
    }

    /// Makes due at once the given-up events still in their grace (see `BURY_GRACE` in the
    /// processor), as if it had passed; returns how many.
    async fn end_graces(&self) -> u64 {
        sqlx::query(&self.db.tables.render(
            "UPDATE {schema}.consumer_held SET next_attempt_at = now() \
             WHERE dead AND next_attempt_at > now()",
        ))
        .execute(&self.db.pool)
        .await
        .unwrap()
        .rows_affected()
    }

    /// Kills every connection of the processors' pool.
    async fn kill_connections(&self) {
        let _ = sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&self.app)
        .execute(&self.db.pool)
        .await;
    }

    /// One delivery with `fault`: whether it is acknowledged (done), with what happened.
    async fn deliver(&self, delivery: &Delivery, fault: Fault, counts: &mut Counts) -> bool {
        let mut event = delivery.event.clone();
        match fault {
            Fault::HandlerError => {
                event.headers.insert("sim-fault".into(), "error".into());
            }
            Fault::HandlerPanic => {
                event.headers.insert("sim-fault".into(), "panic".into());
            }
            _ => {}
        }
        let processor = self.processor(delivery.target);
        let message = event.to_message();
        let result = match fault {
            Fault::Crash(polls) => {
                counts.crashes += 1;
                match run_or_crash(processor.apply(&message), Some(polls)).await {
                    None => return false,
                    Some(result) => result,
                }
            }
            Fault::Twice => {
                counts.twice += 1;
                let (a, b) = futures::join!(processor.apply(&message), processor.apply(&message));
                // Acknowledged if either copy succeeded; the other may have waited on it.
                match (a, b) {
                    (Ok(outcome), _) | (_, Ok(outcome)) => Ok(outcome),
                    (Err(e), _) => Err(e),
                }
            }
            Fault::Outage => {
                counts.outages += 1;
                let (result, ()) = futures::join!(processor.apply(&message), async {
                    tokio::task::yield_now().await;
                    self.kill_connections().await;
                });
                result
            }
            _ => processor.apply(&message).await,
        };
        match result {
            Ok(_) if matches!(fault, Fault::LostAck) => {
                counts.lost_acks += 1;
                false
            }
            Ok(Outcome::Held) => {
                counts.out_of_order += 1;
                true
            }
            Ok(_) => true,
            Err(e) if e.is_infrastructure() => {
                counts.infrastructure += 1;
                counts
                    .errors
                    .push(format!("{:?}: {e}", delivery.event.aggregate_id));
                false
            }
            Err(e) => {
                counts.failures += 1;
                counts
                    .errors
                    .push(format!("{:?}: {e}", delivery.event.aggregate_id));
                false
            }
        }
    }
}

fn draw_fault(rng: &mut StdRng, target: Target) -> Fault {
    let roll = rng.random_range(0..100);
    match roll {
        0..=9 => Fault::Crash(rng.random_range(1..=25)),
        10..=17 => Fault::LostAck,
        18..=25 => Fault::Twice,
        26..=29 => Fault::Outage,
        30..=35 if target == Target::Ledger => Fault::HandlerError,
        36..=37 if target == Target::Ledger => Fault::HandlerPanic,
        _ => Fault::None,
    }
}

/// One seed: the faulty rounds, then the calm drain, then the oracle. Returns its counts.
async fn run_seed(seed: u64) -> Counts {
    let mut rng = StdRng::seed_from_u64(seed);
    let (world, mut queue) = World::new(seed, &mut rng).await;
    let mut dead: Vec<Delivery> = Vec::new();
    let mut counts = Counts::default();
    let mut calm = false;
    let mut rounds = 0u32;
    loop {
        rounds += 1;
        if rounds >= 5_000 {
            let held: Vec<(String, String, i64, String, bool, String)> =
                sqlx::query_as(&world.db.tables.render(
                    "SELECT consumer, coalesce(aggregate_id, ''), coalesce(version, -1), \
                     coalesce(next_attempt_at::text, 'waiting'), dead, reason \
                     FROM {schema}.consumer_held ORDER BY id",
                ))
                .fetch_all(&world.db.pool)
                .await
                .unwrap_or_default();
            panic!(
                "seed {seed}: no progress after 5000 rounds: {} queued, {} dead, held {held:?}, \
                 last errors {:?}",
                queue.len(),
                dead.len(),
                counts.errors
            );
        }
        if !calm && rounds > 60 {
            // The faults stop; liveness from here.
            calm = true;
        }
        // The operator replays the dead letters now and then (and always once calm).
        if !dead.is_empty() && (calm || rng.random_bool(0.1)) {
            counts.replays += dead.len() as u64;
            for mut d in dead.drain(..) {
                d.attempts = 0;
                let at = rng.random_range(0..=queue.len());
                queue.insert(at, d);
            }
        }
        // The held events due are applied now and then, as a runner's sweeper does (a crash
        // may cut it short too); those failed for good join the dead letters.
        if calm || rng.random_bool(0.5) {
            let crash = (!calm && rng.random_bool(0.2)).then(|| rng.random_range(1..=40));
            for (target, processor) in
                [(Target::Ledger, &world.ledger), (Target::Saga, &world.saga)]
            {
                let letters = Letters::default();
                let _ = run_or_crash(processor.apply_due(&world.config, &letters), crash).await;
                for message in letters.0.into_inner().unwrap() {
                    counts.dead_lettered += 1;
                    // Held with the fault of the delivery it arrived in; the operator's fix
                    // cures it.
                    let mut event = message.decode().unwrap();
                    event.headers.remove("sim-fault");
                    dead.push(Delivery {
                        target,
                        event,
                        attempts: 0,
                    });
                }
            }
        }
        // Timeouts fire now and then, racing the payments (a crash may cut them short too).
        if calm || rng.random_bool(0.3) {
            counts.timeout_rounds += 1;
            let crash = (!calm && rng.random_bool(0.2)).then(|| rng.random_range(1..=10));
            if let Some(Ok(fired)) = run_or_crash(world.timeouts.fire_due(), crash).await {
                counts.timeouts_fired += fired as u64;
            }
        }
        if queue.is_empty() {
            if calm && dead.is_empty() {
                if held_rows(&world.db).await == 0 {
                    break;
                }
                // An event given up by a sweep cut short before its dead letter was stored is
                // left to that runner for a grace of 30 s, then any sweep stores it: the
                // simulation lets the grace pass.
                counts.graces_ended += world.end_graces().await;
            }
            calm = true;
            continue;
        }
        let take = rng.random_range(1..=WORKERS).min(queue.len());
        let batch: Vec<Delivery> = queue.drain(..take).collect();
        let faults: Vec<Fault> = batch
            .iter()
            .map(|d| {
                if calm {
                    Fault::None
                } else {
                    draw_fault(&mut rng, d.target)
                }
            })
            .collect();
        counts.deliveries += batch.len() as u64;
        counts.handler_faults += faults
            .iter()
            .filter(|f| matches!(f, Fault::HandlerError | Fault::HandlerPanic))
            .count() as u64;
        let mut round = Counts::default();
        let results = join_all(batch.iter().zip(&faults).map(|(d, f)| {
            let mut mine = Counts::default();
            let world = &world;
            async move {
                let done = world.deliver(d, *f, &mut mine).await;
                (done, mine)
            }
        }))
        .await;
        for ((mut delivery, fault), (done, mine)) in batch.into_iter().zip(faults).zip(results) {
            round.add(&mine);
            if done {
                continue;
            }
            let spent =
                matches!(fault, Fault::HandlerError | Fault::HandlerPanic) || mine.failures > 0;
            if spent {
                delivery.attempts += 1;
            }
            if delivery.attempts >= MAX_ATTEMPTS {
                round.dead_lettered += 1;
                dead.push(delivery);
            } else {
                let at = rng.random_range(0..=queue.len());
                queue.insert(at, delivery);
            }
        }
        counts.add(&round);
    }
    // Only deadlines may be left: they fire once passed.
    let fired = std::sync::atomic::AtomicU64::new(0);
    wait_until("every saga finished", Duration::from_secs(30), || async {
        if let Ok(n) = world.timeouts.fire_due().await {
            fired.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        world.unfinished().await == 0
    })
    .await;
    counts.timeouts_fired += fired.into_inner();
    world.check(seed).await;
    world.pool.close().await;
    counts
}

impl World {
    async fn unfinished(&self) -> i64 {
        sqlx::query_scalar(&self.db.tables.render(
            "SELECT count(*) FROM {schema}.sagas WHERE saga_type = 'checkout-sim' AND NOT finished",
        ))
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// The oracle, from the database.
    async fn check(&self, seed: u64) {
        let rows: Vec<(Uuid, String, i64)> = sqlx::query_as(
            &self
                .db
                .tables
                .render("SELECT event_id, aggregate_id, version FROM {schema}.ledger ORDER BY n"),
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), self.events, "seed {seed}: each event once");
        let mut ids: Vec<Uuid> = rows.iter().map(|r| r.0).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), self.events, "seed {seed}: no event twice");
        let mut applied: HashMap<&str, Vec<i64>> = HashMap::new();
        for (_, aggregate, version) in &rows {
            applied.entry(aggregate).or_default().push(*version);
        }
        let in_order: Vec<i64> = (1..=VERSIONS).collect();
        for (aggregate, versions) in &applied {
            assert_eq!(
                versions, &in_order,
                "seed {seed}: {aggregate} in version order"
            );
        }
        for (order, paid) in &self.paid {
            let (state, finished): (String, bool) = sqlx::query_as(&self.db.tables.render(
                "SELECT state, finished FROM {schema}.sagas \
                 WHERE saga_type = 'checkout-sim' AND correlation_id = $1",
            ))
            .bind(order)
            .fetch_one(&self.db.pool)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: order {order} has no saga: {e}"));
            assert!(finished, "seed {seed}: order {order} stuck in {state}");
            let sent = |event_type: &'static str| async move {
                sqlx::query_scalar::<_, i64>(&self.db.tables.render(
                    "SELECT count(*) FROM {schema}.{events} \
                     WHERE aggregate_id = $1 AND event_type = $2",
                ))
                .bind(order)
                .bind(event_type)
                .fetch_one(&self.db.pool)
                .await
                .unwrap()
            };
            let (take, cancel, refund) = (
                sent("TakePayment").await,
                sent("CancelOrder").await,
                sent("RefundPayment").await,
            );
            let what = format!(
                "seed {seed}: order {order} ({state}, paid {paid}): TakePayment {take}, \
                 CancelOrder {cancel}, RefundPayment {refund}"
            );
            assert_eq!(take, 1, "{what}");
            match state.as_str() {
                "Paid" => assert!(*paid && cancel == 0 && refund == 0, "{what}"),
                "Cancelled" => assert!(cancel == 1 && refund == i64::from(*paid), "{what}"),
                other => panic!("{what}: final state {other}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_side_holds_under_seeded_faults() {
    let seeds: u64 = std::env::var("OUTBOX_CONSUMER_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let mut total = Counts::default();
    for seed in 1..=seeds {
        total.add(&run_seed(seed).await);
    }
    let _ = writeln!(
        std::io::stderr(),
        "consumer simulation, seeds 1..={seeds}: {total:?}"
    );
    // The faults really happened: a run without them would prove nothing.
    assert!(total.crashes > 0 && total.lost_acks > 0 && total.twice > 0);
    assert!(total.outages > 0 && total.infrastructure > 0);
    assert!(total.out_of_order > 0 && total.failures > 0);
    assert!(total.dead_lettered > 0 && total.replays > 0);
    assert!(total.timeouts_fired > 0);
}
