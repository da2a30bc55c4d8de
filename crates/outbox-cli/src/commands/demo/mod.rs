//! `outbox demo`: the orders scenario of the source documents (`examples/orders`), end to end.
//! By default on an embedded setup that needs no service: SQLite for the outbox and the shop,
//! the relay publishing through its webhook publisher to the demo's own consumers over loopback
//! HTTP. Midway, the relay is killed (abruptly, as `kill -9` would) and a new one takes over;
//! some acknowledgements are lost on purpose. The summary is counted from the database once the
//! relay has marked every event it delivered and has stopped.

#[cfg(any(feature = "webhook", feature = "broker-demo"))]
mod progress;

use super::CommandResult;

/// Options of `outbox demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Orders to place.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    orders: u32,
    /// Lose the acknowledgement of every Nth webhook delivery (0: never), to show the inbox
    /// discarding the redeliveries.
    #[arg(long, default_value_t = 15)]
    drop_ack_every: u64,
    /// Keep what the run created (the SQLite file, the PostgreSQL schema or the MySQL database,
    /// printed at the end) instead of removing it.
    #[arg(long)]
    keep: bool,
    /// Run the scenario on PostgreSQL (postgres://…) or MySQL/MariaDB (mysql://…,
    /// mariadb://…) instead of SQLite, in a schema or database of its own.
    #[arg(long)]
    database_url: Option<String>,
    /// Run the scenario through NATS JetStream (nats://…), RabbitMQ (amqp://…) or Kafka
    /// (kafka://…, with the `kafka` feature) instead of webhooks (needs a PostgreSQL
    /// --database-url).
    #[arg(long, requires = "database_url")]
    broker_url: Option<String>,
}

/// Runs the scenario and prints the summary; exits 1 if any guarantee was broken.
#[cfg(any(feature = "webhook", feature = "broker-demo"))]
pub async fn run(args: Args) -> CommandResult {
    if args.broker_url.is_some() && !cfg!(feature = "broker-demo") {
        return Err(
            "this build of outbox has no demo through a broker: build it with the cargo feature \
             `broker-demo`, or leave out --broker-url to run on webhooks"
                .into(),
        );
    }
    if args.broker_url.is_none() && !cfg!(feature = "webhook") {
        return Err(
            "this build of outbox has no demo on webhooks: build it with the cargo feature \
             `webhook`, or give --broker-url"
                .into(),
        );
    }
    println!("outbox demo: an order service, an inventory and a notifications consumer");
    let scenario = outbox_example_orders::Scenario {
        database_url: args.database_url,
        broker_url: args.broker_url,
        drop_ack_every: args.drop_ack_every,
        keep: args.keep,
        ..outbox_example_orders::Scenario::new(args.orders)
    };
    let progress = progress::Bar::new(u64::from(args.orders));
    let summary = outbox_example_orders::run(&scenario, &progress).await;
    progress.finish();
    let summary = summary.map_err(|e| e as Box<dyn std::error::Error>)?;
    print!("\n{summary}");
    Ok(if summary.guarantees_hold() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}

#[cfg(not(any(feature = "webhook", feature = "broker-demo")))]
pub async fn run(_: Args) -> CommandResult {
    Err(
        "this build of outbox has no demo: build it with the cargo feature `webhook` (SQLite, \
         PostgreSQL or MySQL, and webhooks) or `broker-demo` (PostgreSQL with NATS or RabbitMQ)"
            .into(),
    )
}
