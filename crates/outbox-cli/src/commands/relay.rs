//! `outbox relay`.

use std::{net::SocketAddr, num::NonZeroUsize, path::PathBuf, process::ExitCode, sync::Arc};

use outbox_relayer::{health::Health, http, store::Store, Relay};
use tokio_util::sync::CancellationToken;

use super::{connect_waiting, CommandResult, Db};
use crate::{config, logging};

/// Where the relay's settings come from, shared by `outbox relay` and `outbox doctor`: the
/// config file, then the environment, then these flags.
#[derive(clap::Args, Debug)]
pub struct Settings {
    /// PostgreSQL URL (postgres://…), MySQL or MariaDB URL (mysql://…) or SQLite file
    /// (sqlite://path/outbox.db).
    #[arg(long, env = "OUTBOX_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Broker URL: nats://host:4222 (JetStream), amqp://user:pass@host:5672/vhost (RabbitMQ),
    /// redis://host:6379 (Streams), mqtt://host:1883 (MQTT 5), sqs://REGION (AWS SQS) or
    /// sqs+http(s)://host:port (an SQS endpoint such as an emulator), or http(s)://host/path
    /// (webhook; `{destination}` in the path is replaced), an Azure Service Bus connection
    /// string (Endpoint=sb://…;SharedAccessKeyName=…;SharedAccessKey=…) or
    /// sb://NAMESPACE.servicebus.windows.net with the key in the config, or
    /// amqp1://user:pass@host:5672 (any AMQP 1.0 broker), or kafka://host:9092[,host:port].
    #[arg(long, env = "OUTBOX_BROKER_URL", hide_env_values = true)]
    broker_url: Option<String>,
    /// TOML config file (see docs/configuration.md).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address for the dashboard, /metrics, /healthz and /readyz [default: 127.0.0.1:9187].
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Address of a listener of their own for /metrics, /healthz and /readyz; `--listen`
    /// then serves only the dashboard and its API [default: none].
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Schema holding the outbox [default: outbox].
    #[arg(long)]
    schema: Option<String>,
    /// Events table in that schema [default: events].
    #[arg(long)]
    table: Option<String>,
    /// Where events come from: `poll` the events table (default), or `cdc`: stream them
    /// from a PostgreSQL logical replication slot (set up by `outbox migrate --cdc`).
    #[arg(long, value_enum)]
    mode: Option<RelayMode>,
}

impl Settings {
    /// The config file and environment, with these flags over them.
    pub fn load(self) -> Result<config::FileConfig, String> {
        let mut cfg = config::load(self.config.as_deref())?;
        if let Some(url) = self.database_url {
            cfg.database_url = Some(url);
        }
        if let Some(url) = self.broker_url {
            cfg.broker_url = Some(url);
        }
        if let Some(listen) = self.listen {
            cfg.listen = listen;
        }
        if let Some(listen) = self.metrics_listen {
            cfg.metrics_listen = Some(listen);
        }
        if let Some(schema) = self.schema {
            cfg.relay.schema = schema;
        }
        if let Some(table) = self.table {
            cfg.relay.table = table;
        }
        match self.mode {
            Some(RelayMode::Poll) => cfg.relay.mode = outbox_relayer::Mode::Poll,
            Some(RelayMode::Cdc) => cfg.relay.mode = outbox_relayer::Mode::Cdc,
            None => {}
        }
        Ok(cfg)
    }
}

/// Options of `outbox relay`. Flags override the config file and the environment.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    settings: Settings,
    /// This instance's id in the lease table [default: hostname-pid-random].
    #[arg(long)]
    relay_id: Option<String>,
    /// Log format.
    #[arg(long, value_enum)]
    log_format: Option<logging::LogFormat>,
}

/// `--mode`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum RelayMode {
    Poll,
    Cdc,
}

/// Runs the relay until SIGINT or SIGTERM, on a runtime of `worker_threads` threads (its
/// config), which is why it builds its own.
pub fn main(args: Args) -> CommandResult {
    let mut cfg = args.settings.load()?;
    if let Some(id) = args.relay_id {
        cfg.relay.relay_id = Some(id);
    }
    let runtime = runtime(cfg.worker_threads)
        .map_err(|e| format!("starting {} runtime threads: {e}", cfg.worker_threads))?;
    runtime.block_on(run(cfg, args.log_format))
}

/// The relay's runtime. One thread, the default: the relay mostly waits on its database and
/// its broker, and on one thread a publish, its acknowledgement and the batch waiting for it
/// wake one another without a wake-up crossing threads (a futex call and a context switch
/// each); that is about 13% of the relay's CPU per event (bench/RESULTS.md, issue 20). One
/// thread drains 42,000 events a second to NATS at 27% of a core in the bench; more help only
/// a relay whose own CPU is the limit.
fn runtime(threads: NonZeroUsize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if threads.get() == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads.get());
        builder
    };
    builder.enable_all().build()
}

/// Runs the relay of `cfg` until SIGINT or SIGTERM.
async fn run(cfg: config::FileConfig, log_format: Option<logging::LogFormat>) -> CommandResult {
    // The signal handlers are in place before the first log line and before any connection:
    // a SIGTERM at any point from here on stops the relay cleanly rather than killing it.
    let shutdown = CancellationToken::new();
    stop_on_signal(shutdown.clone())?;
    logging::init(log_format.unwrap_or(cfg.log_format.into()));
    cfg.relay.validate()?;
    outbox_relayer::dashboard::check_allowed_hosts(&cfg.allowed_hosts)?;
    #[cfg(feature = "otel")]
    let traces = crate::traces::Traces::from_env()?;
    let database_url = cfg.database_url.as_deref().ok_or(
        "no database URL: pass --database-url, set OUTBOX_DATABASE_URL or database_url in the \
         config file",
    )?;
    let broker_url = cfg.broker_url.clone().ok_or(
        "no broker URL: pass --broker-url (nats://…, amqp://…, kafka://…, sqs://…, redis://…, \
         mqtt://…, http(s)://…), set OUTBOX_BROKER_URL or \
         broker_url in the config file",
    )?;
    // The endpoints are served from the start: /healthz answers while the relay waits for
    // its database or broker, /readyz says which it waits for.
    let waiting_for = format!(
        "waiting for the database at {}",
        super::database_address(database_url)
    );
    let startup = http::Startup::new(waiting_for.clone());
    let (bound, server) = http::serve(cfg.listen, startup.router(), shutdown.clone()).await?;
    // With `metrics_listen`, the probes and the scrape have a listener of their own, and
    // `listen` serves the dashboard alone (503 until the relay runs).
    let probes_startup = http::Startup::new(waiting_for);
    let probes = match cfg.metrics_listen {
        Some(addr) => {
            let (probes_bound, task) =
                http::serve(addr, probes_startup.router(), shutdown.clone()).await?;
            tracing::info!(listen = %probes_bound,
                "serving /metrics, /healthz and /readyz on a listener of their own");
            Some(task)
        }
        None => None,
    };
    tracing::info!(listen = %bound, "serving /healthz; /readyz answers 503 until the relay runs");
    let waiting = |what: String| {
        startup.waiting_for(what.clone());
        probes_startup.waiting_for(what);
    };
    let db = tokio::select! {
        db = connect_waiting(database_url, pool_size(cfg.relay.max_inflight_batches), &waiting) => db?,
        () = shutdown.cancelled() => {
            let _ = server.await;
            if let Some(probes) = probes {
                let _ = probes.await;
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    let broker = outbox_relayer::publishers::BrokerKind::of_url(&broker_url)?;
    let broker_address = broker.address(&broker_url);
    waiting(format!("connecting to the {}", broker.name()));
    let broker_cause = match &broker_address {
        Some(address) => outbox_relayer::doctor::reach(address, BROKER_PROBE)
            .await
            .err(),
        None => None,
    };
    if let Some(cause) = &broker_cause {
        tracing::warn!(broker = broker.name(), %cause,
            "cannot reach the broker; the relay starts and its publishes wait and retry until \
             it can");
    }
    let publisher = outbox_relayer::publishers::connect(&broker_url, cfg.broker_settings()).await?;
    let (relay, admin, store) = match db {
        Db::Postgres(pool) => {
            let cdc = cfg.relay.mode == outbox_relayer::Mode::Cdc;
            let mut relay = Relay::builder(pool.clone(), publisher, cfg.relay.clone());
            if cdc {
                relay = relay.replication_url(database_url);
            }
            // Opening the store first: an outbox not migrated is the first thing to say.
            let relay = relay.build().await?;
            if cdc {
                outbox::postgres::cdc::check_wal_level(&pool).await?;
            }
            let tables = cfg.relay.tables();
            let admin = outbox_relayer::admin::Admin::new(pool.clone(), &tables);
            let store = outbox_relayer::postgres::PgStore::open(pool, &tables).await?;
            (relay, admin, Arc::new(store) as Arc<dyn Store>)
        }
        Db::MySql(_) | Db::Sqlite(_) if cfg.relay.mode == outbox_relayer::Mode::Cdc => {
            return Err("--mode cdc: change data capture needs PostgreSQL".into())
        }
        Db::MySql(pool) => {
            let tables = cfg.relay.tables();
            let relay = Relay::builder(pool.clone(), publisher, cfg.relay.clone())
                .build()
                .await?;
            let session = cfg.relay.mysql_session();
            let admin = outbox_relayer::admin::Admin::mysql_with(pool.clone(), &tables, session);
            let store =
                outbox_relayer::mysql::MySqlStore::open_with(pool, &tables, session).await?;
            (relay, admin, Arc::new(store) as Arc<dyn Store>)
        }
        Db::Sqlite(pool) => {
            let tables = cfg.relay.tables();
            let relay = Relay::builder(pool.clone(), publisher, cfg.relay.clone())
                .build()
                .await?;
            let admin = outbox_relayer::admin::Admin::sqlite(pool.clone(), &tables);
            let store = outbox_relayer::sqlite::SqliteStore::open(pool, &tables).await?;
            (relay, admin, Arc::new(store) as Arc<dyn Store>)
        }
    };
    #[cfg(feature = "otel")]
    let _exporting = match traces {
        Some(traces) => {
            let exporting = traces.start(&relay.metrics())?;
            tracing::info!("exporting a span per published event over OTLP");
            Some(exporting)
        }
        None => None,
    };
    let dashboard = outbox_relayer::dashboard::router(outbox_relayer::dashboard::Dashboard {
        admin,
        store,
        metrics: relay.metrics(),
        token: cfg.admin_token.clone().filter(|t| !t.is_empty()),
        read_token: cfg.read_token.clone().filter(|t| !t.is_empty()),
        listen: bound,
        allowed_hosts: cfg.allowed_hosts.clone(),
    });
    let endpoints = http::router(relay.metrics(), relay.health());
    if probes.is_some() {
        probes_startup.serve(endpoints);
        startup.serve(dashboard);
    } else {
        startup.serve(endpoints.merge(dashboard));
    }
    if let (Some(cause), Some(address)) = (broker_cause, broker_address) {
        relay.health().broker_unreachable(Some(cause));
        tokio::spawn(watch_broker(address, relay.health(), shutdown.clone()));
    }
    let serving = if probes.is_some() {
        "serving the dashboard (/) and /api"
    } else {
        "serving the dashboard (/), /api, /metrics, /healthz, /readyz"
    };
    tracing::info!(listen = %bound, relay_id = relay.relay_id(), "{serving}");
    let result = relay.run(shutdown.clone()).await;
    shutdown.cancel();
    let _ = server.await;
    if let Some(probes) = probes {
        let _ = probes.await;
    }
    result?;
    Ok(ExitCode::SUCCESS)
}

/// How long the start-up look at the broker's server may take.
const BROKER_PROBE: std::time::Duration = std::time::Duration::from_secs(3);

/// Probes a broker that could not be reached at start-up, with backoff, until it can: the relay
/// is not ready meanwhile (`/readyz`: `broker`), and each failure is logged with its cause.
async fn watch_broker(address: String, health: Arc<Health>, shutdown: CancellationToken) {
    let mut backoff = outbox::backoff::Backoff::new(
        std::time::Duration::from_millis(500),
        std::time::Duration::from_secs(30),
    );
    loop {
        let delay = backoff.next();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => return,
        }
        match outbox_relayer::doctor::reach(&address, BROKER_PROBE).await {
            Ok(()) => {
                tracing::info!(broker = %address, "the broker can be reached");
                health.broker_unreachable(None);
                return;
            }
            Err(cause) => {
                tracing::warn!(%cause, retry_in = ?backoff.peek(), "cannot reach the broker yet");
                health.broker_unreachable(Some(cause));
            }
        }
    }
}

/// Database connections for a relay with `max_inflight_batches` batches in flight: one each,
/// four for leases, stats and notifications, at most 32.
fn pool_size(max_inflight_batches: usize) -> u32 {
    max_inflight_batches.saturating_add(4).min(32) as u32
}

/// Installs the SIGINT and SIGTERM handlers now, and cancels `shutdown` on the first signal.
fn stop_on_signal(shutdown: CancellationToken) -> Result<(), std::io::Error> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => tracing::info!("SIGINT received"),
            _ = term.recv() => tracing::info!("SIGTERM received"),
        }
        shutdown.cancel();
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::pool_size;

    /// A `max_inflight_batches` near 2^32 overflowed `as u32 + 4` (a panic in debug builds,
    /// a pool of 0 to 3 connections in release ones).
    #[test]
    fn the_pool_size_is_bounded_whatever_the_config_says() {
        assert_eq!(pool_size(4), 8);
        for n in [28, 4_294_967_292, u32::MAX as usize, usize::MAX] {
            assert_eq!(pool_size(n), 32, "{n}");
        }
    }
}
