//! The runners under seeded faults: the real runner code (lanes, holds, the sweeper, Kafka's
//! offsets and rebalances, the processor and the version gate) on the real PostgreSQL, fed by
//! seeded models of the brokers ([`nats`], [`rabbitmq`], [`kafka`]) instead of the brokers.
//!
//! Each seed draws a [`plan::Plan`] (permanent gaps, relay redeliveries, envelopes), a gate, a
//! late subscriber or not, and runs one or two runners while a relay publishes, under faults:
//! runners crashed at any point (their deliveries dropped unanswered), the database's
//! connections killed, acks lost, Kafka rebalances, handler errors, panics and poison events,
//! the operator replaying dead letters. Then the faults stop, every dead letter is replayed,
//! and the oracle checks, in two steps:
//!
//! 1. **Nothing blocked, nothing held without a reason.** Each aggregate applied a gapless
//!    run of its versions, in order, each once; every later version delivered is held, waiting
//!    for a version that was never delivered (the relay skipped it, or it was gone before the
//!    consumer joined), and says so. Any other aggregate is complete.
//! 2. **Once and in order, or dead-lettered with its reason.** The operator skips every gap
//!    (`consumer-versions skip`, audited); then every event delivered was applied exactly once,
//!    each aggregate in version order, nothing is held, and the only events not applied are
//!    dead letters that can never apply in order (below a first-seen aggregate's start).
//!
//! `OUTBOX_RUNNER_SIM_SEEDS` sets the seeds per scenario (default 4); counts go to stderr.

mod kafka;
mod nats;
mod plan;
mod rabbitmq;
mod world;

use std::{
    collections::{HashSet, VecDeque},
    io::Write,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use futures::future::BoxFuture;
use rand::{rngs::StdRng, Rng, SeedableRng};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use self::{
    plan::{Binding, Envelopes, Plan},
    world::{Fates, Gate, Letters, World},
};
use crate::{
    metrics::Count,
    runner::{self, Worker},
    DeadLetters, Error, Message,
};

const AGGREGATES: usize = 6;
const VERSIONS: i64 = 6;

/// Which broker a scenario models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broker {
    Nats,
    RabbitMq,
    Kafka,
}

#[derive(Clone, Copy, Debug)]
struct Scenario {
    broker: Broker,
    gate: Gate,
    envelopes: Envelopes,
}

/// What a seed did, summed over seeds (the faults must really have happened).
#[derive(Debug, Default)]
struct Counts {
    seeds: u64,
    published: u64,
    crashes: u64,
    outages: u64,
    lost_acks: u64,
    rebalances: u64,
    late_subscribers: u64,
    holds: u64,
    dead_letters: u64,
    replays: u64,
    below_start: u64,
    gaps_skipped: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.seeds += o.seeds;
        self.published += o.published;
        self.crashes += o.crashes;
        self.outages += o.outages;
        self.lost_acks += o.lost_acks;
        self.rebalances += o.rebalances;
        self.late_subscribers += o.late_subscribers;
        self.holds += o.holds;
        self.dead_letters += o.dead_letters;
        self.replays += o.replays;
        self.below_start += o.below_start;
        self.gaps_skipped += o.gaps_skipped;
    }
}

/// The dead letters of every runner of a seed.
#[derive(Clone, Default)]
struct Shared(Arc<Letters>);

impl DeadLetters for Shared {
    fn dead_letter<'a>(
        &'a self,
        message: &'a Message,
        reason: &'a str,
        attempts: u32,
        origin: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>> {
        self.0.dead_letter(message, reason, attempts, origin)
    }
}

/// The modelled broker of a seed.
#[derive(Clone)]
enum Model {
    Nats(nats::Nats),
    RabbitMq(rabbitmq::RabbitMq),
    Kafka(kafka::Kafka),
}

impl Model {
    fn publish(&self, plan: &Plan, index: usize) {
        let event = &plan.events[index];
        match self {
            Self::Nats(m) => m.publish(event.message.clone()),
            Self::RabbitMq(m) => m.publish(event.message.clone()),
            Self::Kafka(m) => m.publish(event.message.clone(), event.event_type, &event.aggregate),
        }
    }

    /// A dead letter published back where it came from (`consumer-dead-letters replay`).
    fn replay(&self, message: &Message) {
        match self {
            Self::Nats(m) => m.publish(message.clone()),
            Self::RabbitMq(m) => m.publish(message.clone()),
            Self::Kafka(m) => {
                let event = message.decode().expect("a replayed message decodes");
                let kind = if event.aggregate_version == Some(1) {
                    "Placed"
                } else {
                    "Changed"
                };
                m.publish(
                    message.clone(),
                    kind,
                    event.aggregate_id.as_deref().unwrap_or(""),
                );
            }
        }
    }

    fn settled(&self) -> bool {
        match self {
            Self::Nats(m) => m.settled(),
            Self::RabbitMq(m) => m.settled(),
            Self::Kafka(m) => m.settled(),
        }
    }

    /// One runner's life until `stop`.
    async fn run(&self, worker: &Worker<Shared>, stop: &CancellationToken, rebalances: bool) {
        let ended = || Error::broker_message("the model's stream ended");
        let result = match self {
            Self::Nats(m) => runner::run(m.stream(), worker, stop, |e| match e {}, ended).await,
            Self::RabbitMq(m) => runner::run(m.stream(), worker, stop, |e| match e {}, ended).await,
            Self::Kafka(m) => {
                let offsets = m.join();
                let consume = crate::kafka::consume::consume(
                    m.stream(rebalances),
                    m,
                    &offsets,
                    worker,
                    worker.config.max_in_hand,
                    Duration::from_millis(20),
                    stop,
                );
                runner::with_sweeper(worker, stop, consume).await
            }
        };
        result.expect("a runner ends only when stopped");
    }
}

/// How a seed's faults are on, and how it ends.
struct Phase {
    calm: AtomicBool,
    stop: CancellationToken,
    crashes: AtomicU64,
    outages: AtomicU64,
}

async fn run_seed(seed: u64, scenario: Scenario) -> Counts {
    let what = format!("{scenario:?}");
    let mut rng = StdRng::seed_from_u64(seed);
    let binding = match scenario.broker {
        Broker::Nats => Binding::Nats,
        Broker::RabbitMq => Binding::RabbitMq,
        Broker::Kafka => Binding::Kafka,
    };
    let plan = plan::plan(&mut rng, AGGREGATES, VERSIONS, scenario.envelopes, binding);
    let world = World::new(seed, &plan, scenario.gate, &mut rng).await;
    let model = match scenario.broker {
        Broker::Nats => Model::Nats(nats::Nats::new(
            StdRng::seed_from_u64(seed ^ 1),
            rng.random_range(2..=20),
            Duration::from_millis(200),
        )),
        Broker::RabbitMq => Model::RabbitMq(rabbitmq::RabbitMq::new(rng.random_range(1..=16), 20)),
        Broker::Kafka => Model::Kafka(kafka::Kafka::new(StdRng::seed_from_u64(seed ^ 1))),
    };
    let mut counts = Counts {
        seeds: 1,
        ..Counts::default()
    };
    // A late subscriber: the first events were published, and gone, before it existed.
    let mut order: VecDeque<usize> = plan.order.iter().copied().collect();
    if rng.random_bool(0.2) {
        counts.late_subscribers += 1;
        let early = rng.random_range(1..=order.len() / 3);
        if let Model::RabbitMq(m) = &model {
            m.bind_later();
        }
        for index in order.drain(..early) {
            model.publish(&plan, index);
        }
        match &model {
            Model::Nats(m) => {
                m.start_here();
            }
            Model::RabbitMq(m) => m.bind(),
            Model::Kafka(m) => m.retain_from_here(),
        }
    }
    let delivered: HashSet<Uuid> = order.iter().map(|&i| plan.events[i].event_id).collect();
    counts.published = plan.order.len() as u64;

    let letters = Shared::default();
    let phase = Phase {
        calm: AtomicBool::new(false),
        stop: CancellationToken::new(),
        crashes: AtomicU64::new(0),
        outages: AtomicU64::new(0),
    };
    let runners = match scenario.broker {
        Broker::Kafka => 1,
        _ => rng.random_range(1..=2),
    };
    let slot = |n: u64| {
        let worker = Worker {
            processor: world.processor.clone(),
            config: world.config.clone(),
            dead: letters.clone(),
            system: "sim",
            outage_wait: Duration::from_millis(50),
        };
        let model = model.clone();
        let phase = &phase;
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(n));
        async move {
            while !phase.stop.is_cancelled() {
                let stop = phase.stop.child_token();
                let calm = phase.calm.load(Ordering::SeqCst);
                let crash_after = Duration::from_millis(rng.random_range(5..=250));
                tokio::select! {
                    () = model.run(&worker, &stop, !calm) => {}
                    () = tokio::time::sleep(crash_after), if !calm => {
                        phase.crashes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    };
    let relay = async {
        let mut rng = StdRng::seed_from_u64(seed ^ 2);
        for index in order.iter().copied() {
            model.publish(&plan, index);
            tokio::time::sleep(Duration::from_micros(rng.random_range(0..=2_000))).await;
        }
    };
    let outages = async {
        let mut rng = StdRng::seed_from_u64(seed ^ 3);
        while !phase.calm.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(20..=200))).await;
            if !phase.calm.load(Ordering::SeqCst) && rng.random_bool(0.3) {
                phase.outages.fetch_add(1, Ordering::Relaxed);
                world.kill_connections().await;
            }
        }
    };
    let fates = Mutex::new(Fates::default());
    // The runners' in-hand gauge, sampled while they run.
    let most_in_hand = std::sync::atomic::AtomicI64::new(0);
    let sampler = async {
        while !phase.stop.is_cancelled() {
            let now = world.processor.metrics().in_hand("sim");
            most_in_hand.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let operator = async {
        let mut rng = StdRng::seed_from_u64(seed ^ 4);
        // Every replay counts, before the calm as during it: a poison event replayed before
        // the calm may be cured on its next try and never come back as a dead letter.
        let mut replays = 0;
        relay.await;
        // Faults go on a while after the last publication, the operator replaying dead
        // letters now and then.
        for _ in 0..rng.random_range(5..=20) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if rng.random_bool(0.3) {
                replay(&model, &letters, &fates, &world, &mut replays);
            }
        }
        phase.calm.store(true, Ordering::SeqCst);
        world.ledger.calm.store(true, Ordering::SeqCst);
        // Calm: every dead letter that can apply is replayed until none is left and the
        // consumer has nothing it would do on its own.
        let mut quiet = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while quiet < 5 {
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "{what} seed {seed}: never settled; broker settled {}, consumer busy {}, \
                     held {:?}, versions {:?}, sessions in a transaction {:?}",
                    model.settled(),
                    world.busy().await,
                    world.held().await,
                    world.versions().await,
                    world.sessions().await
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            let replayed = replay(&model, &letters, &fates, &world, &mut replays);
            quiet = if replayed == 0 && model.settled() && !world.busy().await {
                quiet + 1
            } else {
                0
            };
        }
        if let Model::RabbitMq(m) = &model {
            assert!(
                m.dropped().is_empty(),
                "{what} seed {seed}: the broker dropped messages at the delivery limit: {:?}",
                m.dropped()
            );
        }
        nothing_blocked(seed, &what, &plan, &delivered, &world, &fates).await;
        // The operator skips each aggregate's first gap, waits, and goes on while gaps
        // remain (an aggregate may have two: a version gone before the consumer joined, and
        // one the relay skipped).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            counts.gaps_skipped += world.skip_gaps().await as u64;
            let mut quiet = 0;
            while quiet < 3 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what} seed {seed}: held events never applied after the gaps were \
                     skipped: {:?}; versions {:?}",
                    world.held().await,
                    world.versions().await
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
                quiet = if world.busy().await { 0 } else { quiet + 1 };
            }
            if world.held().await.is_empty() {
                break;
            }
        }
        replays
    };
    let slots = futures::future::join_all((0..runners).map(slot));
    let (replays, (), (), ()) = tokio::join!(
        async {
            let replays = operator.await;
            phase.stop.cancel();
            replays
        },
        async {
            slots.await;
        },
        outages,
        sampler,
    );
    let fates = fates.into_inner().expect("fates");
    world::check(
        seed,
        &what,
        &plan,
        &delivered,
        &world.applied().await,
        &fates,
        scenario.gate,
    );
    assert_eq!(
        world.skips_audited().await,
        counts.gaps_skipped as i64,
        "{what} seed {seed}: every skip audited"
    );
    if let Model::RabbitMq(m) = &model {
        assert!(
            m.dropped().is_empty(),
            "{what} seed {seed}: the broker dropped messages at the delivery limit"
        );
    }
    // One handler call of an aggregate at a time: within a runner, its lane; between
    // runners, the aggregate's state row the gate locks (without a gate, nothing orders two
    // runners' calls).
    if scenario.gate != Gate::None || runners == 1 {
        assert_eq!(
            world.ledger.most_at_once.load(Ordering::SeqCst),
            1,
            "{what} seed {seed}: two calls of one aggregate's handler ran at once"
        );
    }
    assert!(
        most_in_hand.load(Ordering::SeqCst) <= world.config.max_in_hand as i64,
        "{what} seed {seed}: {} messages in hand, max_in_hand {}",
        most_in_hand.load(Ordering::SeqCst),
        world.config.max_in_hand
    );
    counts.replays = replays;
    counts.crashes = phase.crashes.load(Ordering::Relaxed);
    counts.outages = phase.outages.load(Ordering::Relaxed);
    counts.holds = world.processor.metrics().count("sim", Count::Held);
    counts.dead_letters = world.processor.metrics().count("sim", Count::DeadLettered);
    counts.below_start = fates.below_start.len() as u64;
    match &model {
        Model::Nats(m) => counts.lost_acks = m.lost_acks(),
        Model::Kafka(m) => counts.rebalances = m.rebalances(),
        Model::RabbitMq(_) => {}
    }
    world.close().await;
    counts
}

/// Publishes the dead letters back (those below a first-seen start excepted: they can never
/// apply in order, and are recorded as such). Returns how many. A consumer that retries
/// without limit gives no poison event up.
fn replay(
    model: &Model,
    letters: &Shared,
    fates: &Mutex<Fates>,
    world: &World,
    replays: &mut u64,
) -> u64 {
    let taken: Vec<(String, Message)> = std::mem::take(&mut *letters.0 .0.lock().expect("letters"));
    let mut n = 0;
    for (reason, message) in taken {
        assert!(
            world.config.max_attempts != u32::MAX || !reason.contains("poison"),
            "a consumer without an attempt limit gave a failing event up: {reason}"
        );
        if reason.contains("arrived after the gate started") {
            let event = message.decode().expect("decodes");
            fates
                .lock()
                .expect("fates")
                .below_start
                .insert(event.event_id);
            continue;
        }
        model.replay(&message);
        n += 1;
    }
    *replays += n;
    n
}

/// Oracle, first step: before any gap is skipped, each aggregate applied a gapless run of its
/// versions and holds only what waits for a version never delivered, saying so.
async fn nothing_blocked(
    seed: u64,
    what: &str,
    plan: &Plan,
    delivered: &HashSet<Uuid>,
    world: &World,
    fates: &Mutex<Fates>,
) {
    let applied = world.applied().await;
    let held = world.held().await;
    let below = fates.lock().expect("fates").below_start.clone();
    for a in 0..AGGREGATES {
        let aggregate = format!("a{a}");
        let versions: Vec<i64> = applied
            .get(&aggregate)
            .map(|rows| rows.iter().map(|(v, _)| *v).collect())
            .unwrap_or_default();
        let delivered_versions: HashSet<i64> = plan
            .events
            .iter()
            .filter(|e| {
                e.aggregate == aggregate
                    && delivered.contains(&e.event_id)
                    && !below.contains(&e.event_id)
            })
            .map(|e| e.version)
            .collect();
        let mine: Vec<&(Option<String>, Option<i64>, bool, String)> = held
            .iter()
            .filter(|(id, ..)| id.as_deref() == Some(aggregate.as_str()))
            .collect();
        if world.gate == Gate::None || (world.gate == Gate::FirstSeen && versions.is_empty()) {
            // Nothing waits without a gate; a first-seen aggregate starts once settled.
            assert!(
                mine.is_empty(),
                "{what} seed {seed}: {aggregate} holds {mine:?}"
            );
            continue;
        }
        assert!(
            versions.windows(2).all(|w| w[1] == w[0] + 1),
            "{what} seed {seed}: {aggregate} applied {versions:?}: not a gapless run"
        );
        let next = versions.last().map_or(1, |last| last + 1);
        for (_, version, due, reason) in &mine {
            let version = version.expect("a versioned event");
            assert!(
                !due && version > next - 1,
                "{what} seed {seed}: {aggregate} v{version} held ({reason}), due {due}"
            );
            assert!(
                reason.contains(&format!("waiting for version {next}")),
                "{what} seed {seed}: {aggregate} v{version} held for {reason:?}, expected \
                 waiting for version {next}"
            );
            assert!(
                !delivered_versions.contains(&next),
                "{what} seed {seed}: {aggregate} waits for version {next}, which was \
                 delivered: blocked"
            );
        }
        let waiting = !mine.is_empty();
        let complete = delivered_versions.iter().all(|v| versions.contains(v));
        if !(waiting || complete) {
            let missing: Vec<String> = plan
                .events
                .iter()
                .filter(|e| e.aggregate == aggregate && delivered.contains(&e.event_id))
                .filter(|e| !versions.contains(&e.version))
                .map(|e| {
                    format!(
                        "v{} {} inbox {:?}",
                        e.version, e.event_id, e.message.headers
                    )
                })
                .collect();
            let mut inbox = Vec::new();
            for e in plan.events.iter().filter(|e| e.aggregate == aggregate) {
                inbox.push((e.version, world.in_inbox(&e.message).await));
            }
            panic!(
                "{what} seed {seed}: {aggregate} applied {versions:?} of \
                 {delivered_versions:?}, holding nothing; missing {missing:?}; inbox {inbox:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_apply_each_event_once_in_order_under_seeded_faults() {
    let seeds: u64 = std::env::var("OUTBOX_RUNNER_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let first: u64 = std::env::var("OUTBOX_RUNNER_SIM_FIRST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut total = Counts::default();
    let scenarios = [
        (Broker::Nats, Gate::StartingAtOne, Envelopes::Mixed),
        (Broker::Nats, Gate::FirstSeen, Envelopes::Native),
        (Broker::RabbitMq, Gate::StartingAtOne, Envelopes::Mixed),
        (Broker::RabbitMq, Gate::None, Envelopes::Mixed),
        (Broker::Kafka, Gate::StartingAtOne, Envelopes::Mixed),
        (Broker::Kafka, Gate::FirstSeen, Envelopes::Native),
    ];
    // `OUTBOX_RUNNER_SIM_ONLY=rabbitmq` (or `nats`, `kafka`): that broker's scenarios only.
    let only = std::env::var("OUTBOX_RUNNER_SIM_ONLY").ok();
    for (broker, gate, envelopes) in scenarios {
        if only
            .as_deref()
            .is_some_and(|b| !format!("{broker:?}").eq_ignore_ascii_case(b))
        {
            continue;
        }
        let scenario = Scenario {
            broker,
            gate,
            envelopes,
        };
        let mut sum = Counts::default();
        for seed in first..first + seeds {
            sum.add(&run_seed(seed, scenario).await);
        }
        let _ = writeln!(std::io::stderr(), "runner simulation {scenario:?}: {sum:?}");
        total.add(&sum);
    }
    // The faults really happened: a run without them would prove nothing.
    if only.is_some() || seeds < 4 {
        return;
    }
    assert!(total.crashes > 0 && total.outages > 0, "{total:?}");
    assert!(
        total.holds > 0 && total.dead_letters > 0 && total.replays > 0,
        "{total:?}"
    );
    assert!(total.gaps_skipped > 0, "{total:?}");
}
