//! `outbox-bench`: the benchmark harness of the outbox relay. Each scenario is a subcommand;
//! `all` runs them in order and writes the results table. See `bench/README.md`.

mod bigtx;
mod cdc;
mod common;
mod consumer;
mod context;
mod cost;
mod dbbound;
mod drain;
mod kafka;
mod machine;
mod mysql;
mod mysql_beside;
mod naive;
mod natsonly;
mod parked;
mod process;
mod progress;
mod rabbitmq;
mod report;
mod sqlite;
mod sqlonly;
mod steady;
mod traces;
mod writers;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

use crate::{context::Bench, report::Report};

/// The relay's allocator, so that (k) natsonly measures the client as the relay runs it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Benchmarks of the outbox relay against PostgreSQL and NATS JetStream (or Kafka) on this
/// machine.
#[derive(Parser, Debug)]
#[command(name = "outbox-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    options: Options,
}

/// Which scenarios to run.
#[derive(Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    /// (a) Drain a backlog with the real relay binary: events/s and peak RSS.
    Drain,
    /// (b) The same backlog claimed and marked with no broker: PostgreSQL alone.
    Dbbound,
    /// (c) The naive polling loop (50 rows, one update each, sleep 2 s) as a baseline.
    Naive,
    /// (d) Writers' maximum commit rate, then commit-to-ack latency at a fixed rate.
    Steady,
    /// All of the above, (j) sqlonly and (k) natsonly, with the (a)/(b) and (a)/(j) ratios
    /// and the cost breakdown of each phase.
    All,
    /// (e) Polling and the three CDC write modes side by side on `--cdc-database-url`: drain,
    /// latency at `--rate` (default 1000/s), WAL and row writes per event, table left behind.
    Cdc,
    /// (f) One claim's time and rows visited with `--parked` events behind a dead head, next
    /// to the same with nothing parked.
    Parked,
    /// (g) SQLite, the embedded default: a backlog drained by the relay into JetStream next
    /// to the SQLite-alone claim + mark limit, then the batched purge next to one DELETE.
    Sqlite,
    /// (h) MySQL or MariaDB (`--mysql-url`): the same as (g), on two databases of its own.
    Mysql,
    /// (m) MySQL or MariaDB next to the application: its inserts' latency with the relay
    /// draining and the purge archiving, against the same inserts alone.
    MysqlBeside,
    /// (j) The bare claim-and-mark statement (`UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP
    /// LOCKED) RETURNING …`), one client, no broker, on the same backlog and table shape.
    Sqlonly,
    /// (k) The broker client alone: as many messages as the backlog published straight to
    /// JetStream through async-nats, with the relay's headers and window, no database.
    Natsonly,
    /// (l) The cost of OpenTelemetry tracing: the same drain with trace export off, exporting
    /// to a live OTLP receiver, and pointed at a dead endpoint.
    Traces,
    /// (n) The consumer side: a runner (`--broker nats`, `rabbitmq` or `kafka`) with inbox and
    /// version gate applying `--events` messages through a no-op handler, against one-row
    /// autocommit inserts.
    Consumer,
    /// (i) One transaction of `--big-tx-mb` MiB of large events on `--cdc-database-url`, the
    /// relay running: its peak RSS against its RSS before, polling and CDC zero-growth.
    Bigtx,
}

/// Settings shared by every scenario. Flags may come before or after the subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// PostgreSQL URL.
    #[arg(
        long,
        global = true,
        env = "BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    pub database_url: String,
    /// MySQL or MariaDB server for (h) mysql (its databases are created there).
    #[arg(
        long,
        global = true,
        env = "BENCH_MYSQL_URL",
        default_value = "mysql://root@127.0.0.1:3306/test"
    )]
    pub mysql_url: String,
    /// NATS URL (JetStream enabled).
    #[arg(
        long,
        global = true,
        env = "BENCH_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats_url: String,
    /// Broker the relay publishes to in (a) drain. (c) naive and (d) steady always use NATS.
    #[arg(
        long,
        global = true,
        env = "BENCH_BROKER",
        value_enum,
        default_value_t = Broker::Nats
    )]
    pub broker: Broker,
    /// Kafka bootstrap brokers (`host:port[,host:port]`) for `--broker kafka`.
    #[arg(
        long,
        global = true,
        env = "BENCH_KAFKA_BROKERS",
        default_value = "127.0.0.1:9092"
    )]
    pub kafka_brokers: String,
    /// RabbitMQ URL for `--broker rabbitmq`.
    #[arg(
        long,
        global = true,
        env = "BENCH_RABBITMQ_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub rabbitmq_url: String,
    /// Partitions of the topic (a) drains into with `--broker kafka`.
    #[arg(long, global = true, default_value_t = 8)]
    pub kafka_partitions: i32,
    /// The `outbox` binary [default: `outbox` next to this executable].
    #[arg(long, global = true)]
    pub relay_bin: Option<PathBuf>,
    /// Directory for results.md, relay logs and configs.
    #[arg(long, global = true, default_value = "bench/out")]
    pub out: PathBuf,
    /// Backlog size of (a) drain and (b) dbbound.
    #[arg(long, global = true, default_value_t = 1_000_000)]
    pub events: u64,
    /// Distinct aggregates in backlogs and writers' events.
    #[arg(long, global = true, default_value_t = 10_000)]
    pub aggregates: u64,
    /// Batch size: the relay's `max_batch_size` and the claim size of (b).
    #[arg(long, global = true, default_value_t = 1000)]
    pub batch_size: i64,
    /// Batches in flight: the relay's `max_inflight_batches` and the workers of (b).
    #[arg(long, global = true, default_value_t = 4)]
    pub inflight: usize,
    /// Longest wait for the relay to drain a backlog, in seconds.
    #[arg(long, global = true, default_value_t = 1800)]
    pub drain_timeout: u64,
    /// Do not ANALYZE backlogs after inserting them (the planner then knows nothing of them).
    #[arg(long, global = true)]
    pub skip_analyze: bool,
    /// Poll the backlog of (a) and (b) with a cheap `EXISTS` probe every 250 ms, counting it
    /// only every 2 s (the count itself loads PostgreSQL on large backlogs).
    #[arg(long, global = true)]
    pub light_poll: bool,
    /// Duration of (c) naive, in seconds.
    #[arg(long, global = true, default_value_t = 20)]
    pub naive_seconds: u64,
    /// Backlog of (c) naive (it publishes about 25 events/s, so a small one suffices).
    #[arg(long, global = true, default_value_t = 10_000)]
    pub naive_backlog: u64,
    /// (n) consumer: aggregates the runner applies at once, and the floor's connections.
    #[arg(long, global = true, default_value_t = 16)]
    pub consumer_concurrency: usize,
    /// Concurrent writers of (d), each with its own connection.
    #[arg(long, global = true, default_value_t = 16)]
    pub writers: usize,
    /// Duration of each maximum-rate measurement of (d), in seconds.
    #[arg(long, global = true, default_value_t = 10)]
    pub write_seconds: u64,
    /// Duration of the fixed-rate phase of (d), in seconds.
    #[arg(long, global = true, default_value_t = 15)]
    pub steady_seconds: u64,
    /// Fixed write rate of (d) in events/s [default: `rate_fraction` of the measured maximum
    /// rate with NOTIFY on].
    #[arg(long, global = true)]
    pub rate: Option<f64>,
    /// (e) cdc: rounds of the latency phases, interleaved (poll, cdc, zero-growth, table-less,
    /// then again); the table gives the median round's p50 and p99 of each mode, and the range.
    #[arg(long, global = true, default_value_t = 1)]
    pub rounds: u32,
    /// (e) cdc: the modes to run, of `poll`, `cdc`, `zero`, `wal` [default: all four].
    #[arg(long, global = true, value_delimiter = ',')]
    pub modes: Vec<String>,
    /// PostgreSQL with wal_level = logical for (e) cdc (the tests' private server by default).
    #[arg(
        long,
        global = true,
        env = "BENCH_CDC_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5433/postgres"
    )]
    pub cdc_database_url: String,
    /// Fraction of the measured maximum rate used when `--rate` is not given.
    #[arg(long, global = true, default_value_t = 0.5)]
    pub rate_fraction: f64,
    /// (f) parked: events waiting behind the dead head.
    #[arg(long, global = true, default_value_t = 100_000)]
    pub parked: u64,
    /// (f) parked: claims timed in each measurement.
    #[arg(long, global = true, default_value_t = 200)]
    pub claims: usize,
    /// (k) natsonly: publish through the core client with one subscription for every
    /// acknowledgement, instead of the JetStream context's request per message.
    #[arg(long, global = true)]
    pub nats_core: bool,
    /// A `[relay]` setting for the relay under test, as TOML (`claim_linger = "2ms"`);
    /// repeatable. Added to the generated config of every scenario that starts the relay.
    #[arg(long = "relay-setting", global = true)]
    pub relay_settings: Vec<String>,
    /// (i) bigtx: size of the transaction, MiB (two 512 KiB events per MiB).
    #[arg(long, global = true, default_value_t = 512)]
    pub big_tx_mb: u64,
}

/// The broker of (a) drain.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    /// NATS JetStream at `--nats-url`.
    Nats,
    /// Kafka at `--kafka-brokers`.
    Kafka,
    /// RabbitMQ at `--rabbitmq-url` (a topic exchange and one queue bound to it).
    Rabbitmq,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The harness on the `wal_level = logical` server of `--cdc-database-url`, with NATS.
async fn on_cdc_server(options: &Options) -> common::Result<Bench> {
    let mut options = options.clone();
    options.database_url = options.cdc_database_url.clone();
    Bench::connect(options, true, false, false).await
}

/// Prints a report of a scenario (`title`, the machine and its PostgreSQL, `table`) and writes
/// it to `file` in the output directory.
async fn write_report(bench: &Bench, title: &str, table: &str, file: &str) -> common::Result<()> {
    let m = bench.machine().await?;
    let text = format!(
        "# {title}\n\nMachine: nproc {} ({}), PostgreSQL {} (synchronous_commit {}), load \
         average {} at the start; {}.\n\n{table}\n`{}`\n",
        m.nproc,
        m.cpu_model,
        m.postgres,
        m.synchronous_commit,
        m.load_average,
        m.brokers,
        bench.command_line()
    );
    println!("{text}");
    let path = bench.out_dir().join(file);
    std::fs::write(&path, &text)?;
    eprintln!("results written to {}", path.display());
    Ok(())
}

async fn run(cli: Cli) -> common::Result<()> {
    // NATS is needed by (a) unless it drains into Kafka, and always by (c) and (d).
    let needs_nats = match cli.command {
        Command::Drain => cli.options.broker == Broker::Nats,
        Command::Dbbound | Command::Parked | Command::Sqlonly => false,
        Command::Naive
        | Command::Steady
        | Command::All
        | Command::Cdc
        | Command::Bigtx
        | Command::Sqlite
        | Command::Mysql
        | Command::MysqlBeside
        | Command::Natsonly
        | Command::Consumer
        | Command::Traces => true,
    };
    if cli.command == Command::Sqlite {
        let bench = Bench::connect(cli.options, needs_nats, false, false).await?;
        bench.settle("sqlite").await;
        let result = sqlite::run(&bench).await?;
        let m = bench.machine().await?;
        let text = format!(
            "# SQLite, the embedded default\n\nMachine: nproc {} ({}), SQLite {} (WAL, \
             synchronous = FULL, file in `{}`), load average {} at the start; {}.\n\n{}\n`{}`\n",
            m.nproc,
            m.cpu_model,
            sqlite::version().await?,
            bench.out_dir().display(),
            m.load_average,
            m.brokers,
            sqlite::render(&result, "SQLite"),
            bench.command_line()
        );
        println!("{text}");
        let path = bench.out_dir().join("sqlite.md");
        std::fs::write(&path, &text)?;
        eprintln!("results written to {}", path.display());
        return Ok(());
    }
    if cli.command == Command::Mysql {
        let bench = Bench::connect(cli.options, needs_nats, false, false).await?;
        bench.settle("mysql").await;
        let (result, latency) = mysql::run(&bench).await?;
        let m = bench.machine().await?;
        let text = format!(
            "# MySQL / MariaDB\n\nMachine: nproc {} ({}), {}, load average {} at the start; \
             {}.\n\n{}\n{}\n`{}`\n",
            m.nproc,
            m.cpu_model,
            mysql::version(&bench).await?,
            m.load_average,
            m.brokers,
            sqlite::render(&result, "MySQL"),
            mysql::render_latency(&latency),
            bench.command_line()
        );
        println!("{text}");
        let path = bench.out_dir().join("mysql.md");
        std::fs::write(&path, &text)?;
        eprintln!("results written to {}", path.display());
        return Ok(());
    }
    if cli.command == Command::MysqlBeside {
        let bench = Bench::connect(cli.options, needs_nats, false, false).await?;
        let phases = mysql_beside::run(&bench).await?;
        let m = bench.machine().await?;
        let text = format!(
            "# MySQL / MariaDB next to the application\n\nMachine: nproc {} ({}), {}, load \
             average {} at the start; {}.\n\n{}\n`{}`\n",
            m.nproc,
            m.cpu_model,
            mysql::version(&bench).await?,
            m.load_average,
            m.brokers,
            mysql_beside::render(&phases, &bench),
            bench.command_line()
        );
        println!("{text}");
        let path = bench.out_dir().join("mysql-beside.md");
        std::fs::write(&path, &text)?;
        eprintln!("results written to {}", path.display());
        return Ok(());
    }
    if cli.command == Command::Traces {
        let bench = Bench::connect(cli.options, needs_nats, false, false).await?;
        let variants = traces::run(&bench).await?;
        let m = bench.machine().await?;
        let text = format!(
            "# The cost of tracing\n\nMachine: nproc {} ({}), PostgreSQL {}, load average {} at \
             the start; {}. Each drain: {} events into NATS JetStream.\n\n{}\n`{}`\n",
            m.nproc,
            m.cpu_model,
            m.postgres,
            m.load_average,
            m.brokers,
            bench.options.events,
            traces::render(&variants),
            bench.command_line()
        );
        println!("{text}");
        let path = bench.out_dir().join("traces.md");
        std::fs::write(&path, &text)?;
        eprintln!("results written to {}", path.display());
        return Ok(());
    }
    if cli.command == Command::Cdc {
        let bench = on_cdc_server(&cli.options).await?;
        let results = cdc::run(&bench).await?;
        return write_report(&bench, "CDC comparison", &cdc::render(&results), "cdc.md").await;
    }
    if cli.command == Command::Bigtx {
        let bench = on_cdc_server(&cli.options).await?;
        let results = bigtx::run(&bench).await?;
        let table = bigtx::render(&results);
        return write_report(&bench, "One large transaction", &table, "bigtx.md").await;
    }
    if cli.command == Command::Consumer {
        let broker = cli.options.broker;
        let bench = Bench::connect(
            cli.options,
            broker == Broker::Nats,
            broker == Broker::Kafka,
            broker == Broker::Rabbitmq,
        )
        .await?;
        bench.settle("consumer").await;
        let result = consumer::run(&bench).await?;
        let table = consumer::render(&result);
        return write_report(&bench, "The consumer side", &table, "consumer.md").await;
    }
    if cli.command == Command::Parked {
        let bench = Bench::connect(cli.options, false, false, false).await?;
        bench.settle("parked").await;
        let rows = parked::run(&bench, bench.options.parked, bench.options.claims).await?;
        let m = bench.machine().await?;
        let text = format!(
            "# Claims with a parked aggregate\n\nMachine: nproc {} ({}), PostgreSQL {}.\n\n{}\n`{}`\n",
            m.nproc,
            m.cpu_model,
            m.postgres,
            parked::render(&rows),
            bench.command_line()
        );
        println!("{text}");
        let path = bench.out_dir().join("parked.md");
        std::fs::write(&path, &text)?;
        eprintln!("results written to {}", path.display());
        return Ok(());
    }
    let drains = matches!(cli.command, Command::Drain | Command::All);
    let needs_kafka = cli.options.broker == Broker::Kafka && drains;
    let needs_rabbitmq = cli.options.broker == Broker::Rabbitmq && drains;
    let bench = Bench::connect(cli.options, needs_nats, needs_kafka, needs_rabbitmq).await?;
    let mut report = Report::new(bench.machine().await?, bench.command_line());
    let wanted = |c: Command| cli.command == c || cli.command == Command::All;
    // Each scenario is recorded as soon as it finishes, so a later failure keeps earlier figures.
    let mut failed = None;
    if wanted(Command::Drain) {
        bench.settle("drain").await;
        match drain::run(&bench).await {
            Ok(r) => report.drain = Some(r),
            Err(e) => failed = Some(format!("drain: {e}")),
        }
    }
    if failed.is_none() && wanted(Command::Dbbound) {
        bench.settle("dbbound").await;
        match dbbound::run(&bench).await {
            Ok(r) => report.dbbound = Some(r),
            Err(e) => failed = Some(format!("dbbound: {e}")),
        }
    }
    if failed.is_none() && wanted(Command::Sqlonly) {
        bench.settle("sqlonly").await;
        match sqlonly::run(&bench).await {
            Ok(r) => report.sqlonly = Some(r),
            Err(e) => failed = Some(format!("sqlonly: {e}")),
        }
    }
    if failed.is_none() && wanted(Command::Natsonly) {
        bench.settle("natsonly").await;
        match natsonly::run(&bench).await {
            Ok(r) => report.natsonly = Some(r),
            Err(e) => failed = Some(format!("natsonly: {e}")),
        }
    }
    if failed.is_none() && wanted(Command::Naive) {
        bench.settle("naive").await;
        match naive::run(&bench).await {
            Ok(r) => report.naive = Some(r),
            Err(e) => failed = Some(format!("naive: {e}")),
        }
    }
    if failed.is_none() && wanted(Command::Steady) {
        bench.settle("steady").await;
        match steady::run(&bench).await {
            Ok(r) => report.steady = Some(r),
            Err(e) => failed = Some(format!("steady: {e}")),
        }
    }
    let text = report.render();
    println!("{text}");
    let path = bench.out_dir().join("results.md");
    std::fs::write(&path, &text)?;
    eprintln!("results written to {}", path.display());
    match failed {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}
