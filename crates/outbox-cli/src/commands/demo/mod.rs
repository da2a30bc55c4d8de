//! `outbox demo`: the orders scenario of the source documents, end to end, on an embedded
//! default that needs no service: SQLite for the outbox and the shop, the relay publishing
//! through its webhook publisher to the demo's own consumers over loopback HTTP. Midway, the
//! relay is killed (abruptly, as `kill -9` would) and a new one takes over; some broker
//! acknowledgements are lost on purpose. The summary is counted from the database once the
//! relay has marked every event it delivered and has stopped.

#[cfg(feature = "webhook")]
mod embedded;
#[cfg(feature = "webhook")]
mod receiver;
#[cfg(feature = "webhook")]
mod report;
#[cfg(feature = "webhook")]
mod shop;

use super::CommandResult;

/// Options of `outbox demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Orders to place.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    orders: u32,
    /// Lose the broker acknowledgement of every Nth delivery (0: never), to show the inbox
    /// discarding the redeliveries.
    #[arg(long, default_value_t = 15)]
    drop_ack_every: u64,
    /// Keep the SQLite database file (printed at the end) instead of deleting it.
    #[arg(long)]
    keep: bool,
    /// Run the scenario on PostgreSQL instead of SQLite (needs --broker-url).
    #[arg(long, requires = "broker_url")]
    database_url: Option<String>,
    /// Run the scenario through NATS JetStream (nats://…) or RabbitMQ (amqp://…) instead of
    /// webhooks (needs --database-url).
    #[arg(long, requires = "database_url")]
    broker_url: Option<String>,
}

/// Runs the scenario and prints the summary; exits 1 if any guarantee was broken.
pub async fn run(args: Args) -> CommandResult {
    if let (Some(database_url), Some(broker_url)) = (&args.database_url, &args.broker_url) {
        if !database_url.starts_with("postgres://") && !database_url.starts_with("postgresql://") {
            return Err(
                "--database-url: the demo on a broker runs on PostgreSQL (postgres://…); \
                 without the flags it runs on SQLite. MySQL outboxes are relayed by `outbox \
                 relay` but have no demo yet"
                    .into(),
            );
        }
        return with_brokers(database_url, broker_url, args.orders).await;
    }
    embedded_default(&args).await
}

/// The orders example on PostgreSQL and NATS or RabbitMQ.
#[cfg(feature = "broker-demo")]
async fn with_brokers(database_url: &str, broker_url: &str, orders: u32) -> CommandResult {
    println!("outbox demo: the orders scenario on PostgreSQL and {broker_url}");
    let summary = outbox_example_orders::run(&outbox_example_orders::Scenario {
        database_url: database_url.to_owned(),
        broker_url: broker_url.to_owned(),
        orders,
        crash: true,
    })
    .await
    .map_err(|e| e.to_string())?;
    print!("{summary}");
    Ok(if summary.guarantees_hold() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}

#[cfg(not(feature = "broker-demo"))]
async fn with_brokers(_: &str, _: &str, _: u32) -> CommandResult {
    Err(
        "this build of outbox has no demo on PostgreSQL and a broker: build it with the cargo \
         feature `broker-demo`"
            .into(),
    )
}

/// SQLite and webhooks, in a temporary directory (kept with `--keep`).
#[cfg(feature = "webhook")]
async fn embedded_default(args: &Args) -> CommandResult {
    let dir = std::env::temp_dir().join(format!("outbox-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("shop.db");
    let result = embedded::scenario(args, &path).await;
    if !args.keep {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("database kept at {}", path.display());
    }
    result
}

#[cfg(not(feature = "webhook"))]
async fn embedded_default(_: &Args) -> CommandResult {
    Err(
        "this build of outbox has no embedded demo (SQLite and webhooks): build it with the \
         cargo feature `webhook`, or run the demo on PostgreSQL and a broker (--database-url, \
         --broker-url)"
            .into(),
    )
}
