//! Chaos end to end: real PostgreSQL (or MariaDB), real NATS JetStream, real `outbox relay`
//! processes.
//!
//! A run starts a private PostgreSQL, or with `OUTBOX_CHAOS_DATABASE=mariadb` a private
//! MariaDB (its own data folder and port) and a private nats-server
//! (its own port and JetStream store), three `outbox relay` processes, writer tasks committing
//! events over many aggregates through the library (some transactions roll back, some commit
//! late), and an independent consumer reading the stream with async-nats. For
//! `OUTBOX_CHAOS_SECS` seconds a seeded chaos loop kills relays (SIGKILL), pauses one past its
//! lease TTL (SIGSTOP, SIGCONT), and crashes and restarts the broker and PostgreSQL. Then it
//! heals everything, stops the writers, waits (with a deadline) until the stream holds every
//! committed event, and counts: lost (G1), phantoms (G2), order violations (G4), duplicates,
//! lag. Nothing here touches the shared servers.
//!
//! Settings (environment): `OUTBOX_CHAOS_SECS` (chaos duration, default 50),
//! `OUTBOX_CHAOS_SEED` (decimal or 0x-hex; default random, always printed, replays the same
//! schedule of faults and the same writer choices; the timing of the machine still varies),
//! `OUTBOX_CHAOS_MODE` (`poll`, default, or `cdc`: the relays stream a logical replication
//! slot of the private server, which then runs with `wal_level = logical`; one streams, the
//! others stand by, and a kill or a pause of the streamer is a takeover), `OUTBOX_CHAOS_DATABASE`
//! (`postgres`, default, or `mariadb`: polling relays on a MySQL-family outbox).

pub mod broker;
pub mod consumer;
pub mod database;
pub mod monkey;
pub mod purger;
pub mod relays;
pub mod tally;
pub mod writer;

use std::{
    collections::HashSet,
    path::PathBuf,
    sync::OnceLock,
    time::{Duration, Instant},
};

use outbox::postgres::WriteMode;
use outbox_testkit::unique;
use rand::{rngs::StdRng, SeedableRng};
use uuid::Uuid;

use self::{
    broker::{Broker, BrokerKind},
    consumer::Recorder,
    database::{DatabaseKind, Pool, Server},
    monkey::Targets,
    relays::{Fleet, RelaySettings},
    tally::{Figures, Row},
    writer::{WriterSettings, Writers},
};

/// What a run does.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long faults are injected.
    pub duration: Duration,
    /// Seeds the fault schedule and the writers' choices.
    pub seed: u64,
    /// Relay processes.
    pub relays: usize,
    /// Outbox partitions.
    pub partitions: i32,
    /// The relays' lease TTL (a pause lasts longer than this).
    pub lease_ttl: Duration,
    /// The writers.
    pub writer: WriterSettings,
    /// After the chaos, how long the relays get to deliver every committed event.
    pub drain_timeout: Duration,
    /// The broker.
    pub broker: BrokerKind,
    /// Where the relays take events from.
    pub source: Source,
    /// The private database.
    pub database: DatabaseKind,
    /// Whether `outbox purge` runs throughout, alternately archiving (see [`purger`]). The
    /// tally then takes the committed events from the writers' ledger (the purged rows are
    /// gone), and `outbox verify`, which audits the stream against the rows, does not run.
    pub purge: bool,
}

/// The relays' source of events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Claims of pending rows (`mode = "poll"`).
    Poll,
    /// The logical replication stream (`mode = "cdc"`).
    Cdc,
}

impl Source {
    fn mode(self) -> &'static str {
        match self {
            Self::Poll => "poll",
            Self::Cdc => "cdc",
        }
    }
}

impl Settings {
    /// The defaults, with `OUTBOX_CHAOS_SECS`, `OUTBOX_CHAOS_SEED` and `OUTBOX_CHAOS_BROKER`
    /// applied.
    pub fn from_env() -> Self {
        let secs = std::env::var("OUTBOX_CHAOS_SECS")
            .ok()
            .map(|s| {
                s.parse::<u64>()
                    .expect("OUTBOX_CHAOS_SECS: a number of seconds")
            })
            .unwrap_or(50);
        let seed = std::env::var("OUTBOX_CHAOS_SEED")
            .ok()
            .map(|s| {
                match s.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => s.parse(),
                }
                .expect("OUTBOX_CHAOS_SEED: a decimal or 0x-hex number")
            })
            .unwrap_or_else(rand::random);
        Self {
            duration: Duration::from_secs(secs),
            seed,
            relays: 3,
            partitions: 16,
            lease_ttl: Duration::from_secs(2),
            writer: WriterSettings {
                writers: 6,
                aggregates_per_writer: 40,
                rollback_ratio: 0.08,
                late_ratio: 0.04,
                bulk_ratio: 0.03,
                write_mode: WriteMode::Table,
            },
            drain_timeout: Duration::from_secs(120),
            broker: match std::env::var("OUTBOX_CHAOS_BROKER").as_deref() {
                Err(_) | Ok("nats") => BrokerKind::Nats,
                Ok("rabbitmq") => BrokerKind::RabbitMq,
                Ok(other) => panic!("OUTBOX_CHAOS_BROKER={other:?}: nats or rabbitmq"),
            },
            source: match std::env::var("OUTBOX_CHAOS_MODE").as_deref() {
                Err(_) | Ok("poll") => Source::Poll,
                Ok("cdc") => Source::Cdc,
                Ok(other) => panic!("OUTBOX_CHAOS_MODE={other:?}: poll or cdc"),
            },
            database: match std::env::var("OUTBOX_CHAOS_DATABASE").as_deref() {
                Err(_) | Ok("postgres") => DatabaseKind::Postgres,
                Ok("mariadb") => DatabaseKind::MariaDb,
                Ok(other) => panic!("OUTBOX_CHAOS_DATABASE={other:?}: postgres or mariadb"),
            },
            purge: false,
        }
    }

    /// These settings on a private MariaDB (polling; MySQL has no CDC), with the purge
    /// running throughout beside the relays and the writers (some of whose transactions stay
    /// open for seconds on their aggregates).
    pub fn mariadb(mut self) -> Self {
        self.database = DatabaseKind::MariaDb;
        self.source = Source::Poll;
        self.writer.write_mode = WriteMode::Table;
        self.purge = true;
        self
    }

    /// These settings in CDC mode, writing with `OUTBOX_CHAOS_WRITE_MODE` (`table`,
    /// `zero-growth` or `table-less`); by default a mode the seed picks, so that runs cover all
    /// three.
    pub fn cdc(mut self) -> Self {
        self.source = Source::Cdc;
        self.writer.write_mode = match std::env::var("OUTBOX_CHAOS_WRITE_MODE").as_deref() {
            Ok("table") => WriteMode::Table,
            Ok("zero-growth") => WriteMode::ZeroGrowth,
            Ok("table-less") => WriteMode::WalOnly,
            Ok(other) => {
                panic!("OUTBOX_CHAOS_WRITE_MODE={other:?}: table, zero-growth or table-less")
            }
            Err(_) => [WriteMode::Table, WriteMode::ZeroGrowth, WriteMode::WalOnly]
                [(self.seed % 3) as usize],
        };
        self
    }
}

/// What a run found.
pub struct Outcome {
    /// The counts.
    pub figures: Figures,
    /// Whether every committed event reached the stream before the drain deadline.
    pub drained: bool,
    /// `outbox verify` on the run's outbox and stream: (exit 0, its output).
    pub verify: (bool, String),
    /// Relays that did not exit cleanly on SIGTERM at the end.
    pub unclean_exits: Vec<String>,
    /// Where the relays' logs are (deleted by [`Outcome::cleanup`]).
    pub log_dir: PathBuf,
}

impl Outcome {
    /// Deletes the logs (call once the run passed; a failed run keeps them).
    pub fn cleanup(self) {
        let _ = std::fs::remove_dir_all(&self.log_dir);
    }
}

/// Prints a line of the run's log, with the time since the run started.
pub fn log(line: &str) {
    let start = START.get_or_init(Instant::now);
    println!("[chaos {:7.1}s] {line}", start.elapsed().as_secs_f64());
}

static START: OnceLock<Instant> = OnceLock::new();

/// Runs the whole scenario.
pub async fn run(settings: &Settings) -> Outcome {
    log(&format!(
        "seed {:#x} (OUTBOX_CHAOS_SEED), {:?} of chaos, {} relays in mode {}, writes {:?}, \
         {} partitions",
        settings.seed,
        settings.duration,
        settings.relays,
        settings.source.mode(),
        settings.writer.write_mode,
        settings.partitions
    ));
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let log_dir = std::env::temp_dir().join(unique("chaos-run"));
    std::fs::create_dir_all(&log_dir).expect("log folder");

    let mut database = Server::start(settings.database, settings.source == Source::Cdc).await;
    let pool = Pool::connect(&database, settings.writer.writers as u32 + 4).await;
    pool.migrate(settings.partitions).await;
    if let (Source::Cdc, Pool::Pg(pool)) = (settings.source, &pool) {
        let tables = outbox::Tables::default();
        outbox::postgres::cdc::setup(
            pool,
            &tables,
            &outbox::postgres::cdc::CdcNames::for_tables(&tables),
        )
        .await
        .expect("create the replication slot and publication");
    }
    writer::prepare(&pool, settings.writer).await;
    let prefix = unique("chaos");
    let mut broker = Broker::start(settings.broker, &prefix).await;
    let config = log_dir.join("relay.toml");
    std::fs::write(
        &config,
        relay_config(settings, &prefix) + &broker.relay_config(),
    )
    .expect("relay config");
    log(&format!(
        "private {} at {}, {}, logs in {}",
        database.name(),
        database.url(),
        broker.describe(),
        log_dir.display()
    ));

    let mut fleet = Fleet::start(
        settings.relays,
        RelaySettings {
            database_url: database.url(),
            broker_url: broker.url.clone(),
            config,
            log_dir: log_dir.clone(),
        },
    );
    let writers = Writers::start(pool.clone(), settings.writer, settings.seed);
    let purger = settings
        .purge
        .then(|| purger::Purger::start(database.url()));
    let faults = monkey::run(
        settings.duration,
        settings.lease_ttl,
        &mut rng,
        Targets {
            fleet: &mut fleet,
            nats: broker.restartable(),
            database: &mut database,
        },
    )
    .await;
    log(&format!(
        "stopping the writers ({} events so far)",
        writers.written()
    ));
    let ledger = writers.stop().await;
    // Rows only for what committed in table mode; otherwise the ledger and the business
    // table say what committed (the rows the relay wrote back give their status).
    let keeps_rows = settings.writer.write_mode == WriteMode::Table && !settings.purge;
    let committed = |rows: Vec<Row>, business: &[(String, i64)]| {
        if keeps_rows {
            rows
        } else {
            tally::committed_from_ledger(&ledger, business, &rows)
        }
    };
    let business = pool.business_versions().await;
    let table = committed(pool.committed_rows().await, &business);
    log(&format!(
        "{} events committed; waiting for the stream to hold them all",
        table.len()
    ));
    let drained = wait_for_all(&broker.recorder, &table, &mut fleet, settings.drain_timeout).await;
    if drained {
        let deadline = Instant::now() + settings.drain_timeout;
        while pool.pending().await > 0 && Instant::now() < deadline {
            fleet.tick();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let purges = match purger {
        Some(purger) => purger.stop().await,
        None => Default::default(),
    };
    log(&format!(
        "{} rows pending; SIGTERM to every relay",
        pool.pending().await
    ));
    let unclean_exits = fleet.terminate_all(Duration::from_secs(30)).await;
    let table = committed(pool.committed_rows().await, &business);
    // `outbox verify` audits the stream against the table: in table mode only.
    let verify = if keeps_rows {
        log("relays stopped; running outbox verify");
        let verify = verify(&database.url(), &broker.url, &broker.verify_args());
        log("verify done");
        verify
    } else {
        (
            true,
            "not run: the events leave no rows to audit, or the purge took them".into(),
        )
    };
    let consumer_resumes = broker.recorder.resumes();
    let records = broker.stop().await;
    pool.close().await;

    let mut figures = tally::tally(&ledger, &table, &business, &records);
    figures.faults = faults;
    figures.purges = purges;
    figures.lag_to = match settings.broker {
        BrokerKind::Nats => "broker",
        BrokerKind::RabbitMq => "consumer",
    };
    figures.relay_exits = fleet.exits.len();
    figures.consumer_resumes = consumer_resumes;
    Outcome {
        figures,
        drained,
        verify,
        unclean_exits,
        log_dir,
    }
}

fn relay_config(settings: &Settings, prefix: &str) -> String {
    format!(
        r#"# Written by the chaos test.
[relay]
mode = "{mode}"
lease_ttl = "{ttl}ms"
heartbeat_interval = "{heartbeat}ms"
poll_interval = "200ms"
stats_interval = "1s"
max_batch_size = 500
[relay.retry]
initial_backoff = "20ms"
max_backoff = "500ms"
max_transient_backoff = "500ms"
[relay.routing]
default = "{prefix}.{{aggregate_type}}.{{event_type}}"
[relay.cdc]
heartbeat_interval = "1s"
"#,
        mode = settings.source.mode(),
        ttl = settings.lease_ttl.as_millis(),
        heartbeat = settings.lease_ttl.as_millis() / 4,
    )
}

/// Waits until the stream holds every event of `table`, or `timeout`; the supervisor keeps
/// restarting relays meanwhile.
async fn wait_for_all(
    recorder: &Recorder,
    table: &[Row],
    fleet: &mut Fleet,
    timeout: Duration,
) -> bool {
    let mut missing: HashSet<Uuid> = table.iter().map(|r| r.event_id).collect();
    let mut read = 0;
    let deadline = Instant::now() + timeout;
    loop {
        fleet.tick();
        let new = recorder.records_since(read);
        read += new.len();
        for r in &new {
            if let Ok(id) = Uuid::parse_str(&r.event_id) {
                missing.remove(&id);
            }
        }
        if missing.is_empty() {
            log("the stream holds every committed event");
            return true;
        }
        if Instant::now() >= deadline {
            log(&format!(
                "deadline: {} committed events still not in the stream",
                missing.len()
            ));
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `outbox verify`, the operator's audit, on the run's outbox and stream.
fn verify(database_url: &str, broker_url: &str, args: &[String]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["verify", "--database-url", database_url])
        .args(["--broker-url", broker_url])
        .args(args)
        .output()
        .expect("run outbox verify");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
