//! `outbox`: the demo, the schema, the relay and the operator's tools (status, dead letters,
//! purge, verify, sagas, event schemas).

mod commands;
mod config;
mod escape;
mod logging;
mod table;
#[cfg(feature = "otel")]
mod traces;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc serves the relay's many small, short-lived allocations (headers, futures, rows)
/// far cheaper than glibc's allocator (bench/RESULTS.md, issue 20).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Transactional outbox: publish committed events to your broker, at least once, in order per
/// aggregate.
///
/// `demo` runs the orders scenario end to end (no services needed). `migrate` creates or
/// upgrades the schema, `doctor` checks a set-up, `relay` publishes, `healthcheck` probes a
/// running relay (a container's HEALTHCHECK). `status`, `dead-letters`, `purge`, `verify`,
/// `sagas` and `schema` inspect and operate the outbox; `consumer-dead-letters` lists and
/// replays a consumer's dead letters; `consumer-versions` shows and moves a consumer's version
/// gate and held events.
#[derive(Parser, Debug)]
#[command(name = "outbox", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the orders scenario end to end on an embedded default (SQLite + webhooks): no
    /// services needed.
    Demo(commands::demo::Args),
    /// Create or upgrade the outbox schema (idempotent, safe to run from several processes).
    Migrate(commands::migrate::Args),
    /// Check a set-up (database, CDC, relays, broker, config): one line per check, each
    /// problem with its fix. Exit 1 when a check fails.
    Doctor(commands::doctor::Args),
    /// Publish committed events to the broker until SIGINT/SIGTERM.
    Relay(commands::relay::Args),
    /// GET a relay's /healthz (or --url): exit 0 on a 2xx answer, 1 otherwise, with one line
    /// saying why. For a container's HEALTHCHECK: no curl needed.
    Healthcheck(commands::healthcheck::Args),
    /// Backlog, lag, dead letters and partition owners.
    Status(commands::status::Args),
    /// Delete published events older than a retention (never pending or dead ones).
    Purge(commands::purge::Args),
    /// List, inspect, replay or skip dead letters (audited).
    DeadLetters(commands::dead_letters::Args),
    /// List or replay the dead letters of an outbox-consumer runner (NATS, RabbitMQ, Kafka;
    /// audited).
    ConsumerDeadLetters(commands::consumer_dead_letters::Args),
    /// A consumer's version gate and held events: list, held, seed, skip (audited).
    ConsumerVersions(commands::consumer_versions::Args),
    /// Audit a broker stream against the outbox: missing, duplicated, out-of-order events.
    Verify(commands::verify::Args),
    /// Saga instances and their history: state, deadline, every step, unexpected events.
    Sagas(commands::sagas::Args),
    /// Event schema tools: `check` that a new version is backward compatible (for CI).
    Schema(commands::schema::Args),
}

fn main() -> ExitCode {
    // One TLS provider for the process: the build links rustls with both ring and aws-lc-rs
    // (through other clients), and sqlx's certificate verification (`sslmode=verify-ca`,
    // `verify-full`, MySQL's `VERIFY_*`) takes the process default, which rustls cannot pick
    // alone between two.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let result = match cli.command {
        // The relay sizes its runtime from its config (`worker_threads`).
        Command::Relay(args) => commands::relay::main(args),
        command => match tokio::runtime::Runtime::new() {
            Ok(runtime) => runtime.block_on(run(command)),
            Err(error) => Err(error.into()),
        },
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            // The last line of defence for what an error quotes: URLs without their
            // secrets, writers' data without control characters.
            let text = outbox_relayer::redact::urls_in(&render_chain(error.as_ref()));
            eprintln!("error: {}", escape::control(&text));
            ExitCode::from(2)
        }
    }
}

/// Runs every command but `relay` on a multi-threaded runtime.
async fn run(command: Command) -> commands::CommandResult {
    match command {
        Command::Demo(args) => commands::demo::run(args).await,
        Command::Migrate(args) => commands::migrate::run(args).await,
        Command::Doctor(args) => commands::doctor::run(args).await,
        Command::Relay(_) => unreachable!("`outbox relay` builds its own runtime (see `main`)"),
        Command::Healthcheck(args) => commands::healthcheck::run(args).await,
        Command::Status(args) => commands::status::run(args).await,
        Command::Purge(args) => commands::purge::run(args).await,
        Command::DeadLetters(args) => commands::dead_letters::run(args).await,
        Command::ConsumerDeadLetters(args) => commands::consumer_dead_letters::run(args).await,
        Command::ConsumerVersions(args) => commands::consumer_versions::run(args).await,
        Command::Verify(args) => commands::verify::run(args).await,
        Command::Sagas(args) => commands::sagas::run(args).await,
        Command::Schema(args) => commands::schema::run(args).await,
    }
}

/// "outer: inner: root" — every cause, so the message names what is wrong.
fn render_chain(error: &(dyn std::error::Error + 'static)) -> String {
    outbox::error_chain(error)
}
