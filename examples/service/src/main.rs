//! `order-service`: the example service, configured from the environment:
//! `DATABASE_URL` (default the local `test` database), `BROKER_URL` (default
//! `nats://127.0.0.1:4222`), `LISTEN` (default `127.0.0.1:3000`), `OUTBOX_SCHEMA`
//! (default `outbox`) and `NATS_STREAM` (default `OUTBOX`). Stops gracefully on SIGTERM or Ctrl-C.

use std::time::Duration;

use outbox_example_service::{BoxError, Config, Service};
use outbox_relayer::{publishers::BrokerSettings, RelayConfig};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let mut brokers = BrokerSettings::default();
    brokers.nats.stream = env("NATS_STREAM", "OUTBOX");
    let config = Config {
        database_url: env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
        broker_url: env("BROKER_URL", "nats://127.0.0.1:4222"),
        listen: env("LISTEN", "127.0.0.1:3000")
            .parse()
            .map_err(|e| format!("LISTEN: {e}"))?,
        relay: RelayConfig {
            schema: env("OUTBOX_SCHEMA", "outbox"),
            ..RelayConfig::default()
        },
        brokers,
        drain_timeout: Duration::from_secs(20),
    };
    let service = Service::start(config).await?;
    let stopping = async {
        shutdown_signal().await;
        // A second signal while stopping: stop at once (what is not recorded is published
        // again by the next relay).
        tokio::spawn(async {
            shutdown_signal().await;
            eprintln!("second signal: exiting without finishing");
            std::process::exit(130);
        });
    };
    service.run_until(stopping).await?;
    tracing::info!("order service stopped");
    Ok(())
}

/// SIGTERM (what an orchestrator sends) or Ctrl-C.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
