//! The chaos loop: at seeded random moments, one of five faults. The first five faults are the
//! five kinds in a seeded random order, so every run has each kind at least once.

use std::time::{Duration, Instant};

use outbox_testkit::NatsServer;
use rand::{
    rngs::StdRng,
    seq::{IndexedRandom, SliceRandom},
    Rng,
};

use super::database::Server;

use super::relays::Fleet;

/// A fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a relay; it is restarted 0–1.5 s later.
    Kill,
    /// SIGSTOP a relay for longer than the lease TTL, then SIGCONT.
    Pause,
    /// SIGKILL the broker; restart it 0–2 s later (same port, same store).
    RestartBroker,
    /// SIGKILL the database (every process of it); restart it 0–2 s later (crash recovery).
    RestartDatabase,
    /// SIGSTOP the broker for 1–5 s, then SIGCONT: it keeps its connections and answers
    /// nothing (publishes time out), as a broker or endpoint that hangs.
    HangBroker,
}

const ALL: [Fault; 5] = [
    Fault::Kill,
    Fault::Pause,
    Fault::RestartBroker,
    Fault::RestartDatabase,
    Fault::HangBroker,
];

/// How many faults of each kind were injected.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    /// Relays killed.
    pub kills: usize,
    /// Relays paused past their lease TTL.
    pub pauses: usize,
    /// Broker restarts.
    pub broker_restarts: usize,
    /// Database crashes and restarts.
    pub database_restarts: usize,
    /// Broker hangs.
    pub broker_hangs: usize,
}

/// What the loop works on.
pub struct Targets<'a> {
    /// The relays.
    pub fleet: &'a mut Fleet,
    /// The private broker, if it may be restarted.
    pub nats: Option<&'a mut NatsServer>,
    /// The private database.
    pub database: &'a mut Server,
}

/// Injects faults for `duration`, with 0.5–3 s between them, then heals: every relay resumed
/// or restarted (the broker and the database are up after each fault).
pub async fn run(
    duration: Duration,
    lease_ttl: Duration,
    rng: &mut StdRng,
    targets: Targets<'_>,
) -> Counts {
    let Targets {
        fleet,
        mut nats,
        database,
    } = targets;
    let end = Instant::now() + duration;
    let kinds: Vec<Fault> = ALL
        .into_iter()
        .filter(|f| !matches!(f, Fault::RestartBroker | Fault::HangBroker) || nats.is_some())
        .collect();
    let mut first = kinds.clone();
    first.shuffle(rng);
    let mut queue = first.into_iter();
    let mut counts = Counts::default();
    let mut next = Instant::now() + gap(rng);
    // A relay fault with no relay to hit (all down for a moment) waits for one.
    let mut postponed: Option<Fault> = None;
    loop {
        fleet.tick();
        let now = Instant::now();
        if now >= end {
            break;
        }
        if now < next {
            idle(fleet, next.min(end)).await;
            continue;
        }
        let fault = postponed
            .take()
            .or_else(|| queue.next())
            .unwrap_or_else(|| loop {
                let roll: f64 = rng.random();
                let fault = match roll {
                    r if r < 0.30 => Fault::Kill,
                    r if r < 0.50 => Fault::Pause,
                    r if r < 0.65 => Fault::RestartBroker,
                    r if r < 0.85 => Fault::RestartDatabase,
                    _ => Fault::HangBroker,
                };
                if kinds.contains(&fault) {
                    break fault;
                }
            });
        match fault {
            Fault::Kill => {
                let alive = fleet.alive();
                if let Some(&slot) = alive.choose(rng) {
                    let restart = Duration::from_millis(rng.random_range(0..1_500));
                    super::log(&format!(
                        "kill -9 {} (restart in {restart:?})",
                        fleet.name(slot)
                    ));
                    fleet.kill(slot, restart);
                    counts.kills += 1;
                } else {
                    postponed = Some(fault);
                    next = now + Duration::from_millis(250);
                    continue;
                }
            }
            Fault::Pause => {
                let running = fleet.running();
                if let Some(&slot) = running.choose(rng) {
                    let pause = lease_ttl + Duration::from_millis(rng.random_range(500..2_500));
                    super::log(&format!("kill -STOP {} for {pause:?}", fleet.name(slot)));
                    fleet.pause(slot, pause);
                    counts.pauses += 1;
                } else {
                    postponed = Some(fault);
                    next = now + Duration::from_millis(250);
                    continue;
                }
            }
            Fault::RestartBroker => {
                let nats = nats
                    .as_deref_mut()
                    .expect("only drawn with a private broker");
                let down = Duration::from_millis(rng.random_range(0..2_000));
                super::log(&format!("kill -9 nats-server, down for {down:?}"));
                nats.stop();
                idle(fleet, Instant::now() + down).await;
                nats.restart().await;
                super::log("nats-server up");
                counts.broker_restarts += 1;
            }
            Fault::HangBroker => {
                let nats = nats.as_deref().expect("only drawn with a private broker");
                let hang = Duration::from_millis(rng.random_range(1_000..5_000));
                super::log(&format!("kill -STOP nats-server for {hang:?}"));
                nats.freeze();
                idle(fleet, Instant::now() + hang).await;
                nats.thaw();
                super::log("nats-server answers again");
                counts.broker_hangs += 1;
            }
            Fault::RestartDatabase => {
                let down = Duration::from_millis(rng.random_range(0..2_000));
                super::log(&format!("kill -9 {}, down for {down:?}", database.name()));
                database.crash();
                idle(fleet, Instant::now() + down).await;
                database.start_again().await;
                super::log(&format!("{} up (after crash recovery)", database.name()));
                counts.database_restarts += 1;
            }
        }
        next = Instant::now() + gap(rng);
    }
    super::log("chaos over: resuming and restarting every relay");
    fleet.heal();
    counts
}

fn gap(rng: &mut StdRng) -> Duration {
    Duration::from_millis(rng.random_range(500..3_000))
}

/// Sleeps until `until`, waking for the fleet's due resumes and restarts (and at least every
/// 250 ms to notice relays that exited).
async fn idle(fleet: &mut Fleet, until: Instant) {
    loop {
        fleet.tick();
        let now = Instant::now();
        if now >= until {
            return;
        }
        let wake = fleet
            .next_due()
            .unwrap_or(until)
            .min(until)
            .min(now + Duration::from_millis(250))
            .max(now);
        tokio::time::sleep_until(wake.into()).await;
    }
}
