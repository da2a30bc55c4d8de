//! `orders`: the orders flow on PostgreSQL and NATS JetStream or RabbitMQ (`outbox demo` runs
//! it on the other databases and on webhooks).
//!
//! ```text
//! cargo run -p outbox-example-orders -- --database-url postgres://postgres@127.0.0.1:5432/test \
//!     --broker-url nats://127.0.0.1:4222
//! cargo run -p outbox-example-orders -- --saga orchestrated   # or choreographed
//! ```

use std::process::ExitCode;

use clap::Parser;
use outbox_example_orders::{run, Lines, Scenario};

/// Places orders through the outbox and checks that each is applied once by each consumer.
#[derive(Parser, Debug)]
struct Args {
    /// PostgreSQL URL.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    database_url: String,
    /// nats://… or amqp://…
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    broker_url: String,
    /// Orders to place.
    #[arg(long, default_value_t = 300)]
    orders: u32,
    /// Do not kill the relay midway (nor consumers, in a saga run).
    #[arg(long)]
    no_crash: bool,
    /// Run the order saga instead (CreateOrder → ReserveInventory → ProcessPayment → ShipOrder,
    /// with compensation and an inventory timeout): `orchestrated` or `choreographed`.
    #[arg(long, value_parser = ["orchestrated", "choreographed"])]
    saga: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(mode) = &args.saga {
        return saga(&args, mode).await;
    }
    let scenario = Scenario {
        database_url: Some(args.database_url),
        broker_url: Some(args.broker_url),
        crash: !args.no_crash,
        ..Scenario::new(args.orders)
    };
    let result = run(&scenario, &Lines).await;
    exit(result.map(|s| (s.guarantees_hold(), s)))
}

async fn saga(args: &Args, mode: &str) -> ExitCode {
    use outbox_example_orders::fulfilment::{run, Mode, Scenario};
    let mode = if mode == "orchestrated" {
        Mode::Orchestrated
    } else {
        Mode::Choreographed
    };
    let scenario = Scenario {
        crashes: !args.no_crash,
        ..Scenario::new(&args.database_url, &args.broker_url, mode, args.orders)
    };
    let result = run(&scenario).await;
    exit(result.map(|r| (r.guarantees_hold(), r)))
}

/// Prints what a run counted: exit 0 when the guarantees held, 1 when not, 2 on an error.
fn exit<T: std::fmt::Display>(
    result: Result<(bool, T), outbox_example_orders::BoxError>,
) -> ExitCode {
    match result {
        Ok((held, counts)) => {
            print!("{counts}");
            if held {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {}", outbox::error_chain(e.as_ref()));
            ExitCode::from(2)
        }
    }
}
