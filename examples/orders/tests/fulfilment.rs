//! The order saga end to end on PostgreSQL and a real broker, orchestrated and choreographed,
//! with crashes injected: relays and consumers killed abruptly, steps failing after their
//! writes. Every order must end completed or cancelled, no stock left reserved for a cancelled
//! order, no step applied twice.

use std::io::Write;

use outbox_example_orders::fulfilment::{run, Mode, Report, Scenario};
use outbox_testkit::{database_url, NATS_URL, RABBITMQ_URL};

const ORDERS: u32 = 120;

/// Orders among the first `ORDERS` whose number ends in `digit` (see `Ticket::nth`).
fn ending_in(digit: u32) -> i64 {
    (0..ORDERS).filter(|n| n % 10 == digit).count() as i64
}

async fn fulfil(broker_url: &str, mode: Mode, seed: u64) -> Report {
    let scenario = Scenario {
        seed,
        ..Scenario::new(&database_url(), broker_url, mode, ORDERS)
    };
    let report = run(&scenario).await.expect("the run completes");
    // Straight to stderr, past the test harness's capture: CI logs show the counts.
    let _ = writeln!(std::io::stderr(), "{report}");
    assert_eq!(report.orders, i64::from(ORDERS));
    assert_eq!(report.stuck, 0, "{report}");
    assert_eq!(report.left_reserved, 0, "{report}");
    assert_eq!(report.applied_twice, 0, "{report}");
    assert!(report.guarantees_hold(), "{report}");
    assert_eq!(report.backorders, ending_in(7));
    assert!(
        report.compensated >= 1,
        "payment failures compensated: {report}"
    );
    assert!(report.completed >= 1, "{report}");
    assert!(
        report.timeouts >= ending_in(7),
        "every back-order timed out: {report}"
    );
    assert!(
        report.relay_kills >= 1 && report.consumer_kills >= 1 && report.failed_steps >= 1,
        "crashes were injected: {report}"
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orchestrated_order_saga_survives_crashes_through_nats() {
    let report = fulfil(NATS_URL, Mode::Orchestrated, 11).await;
    assert_eq!(report.saga_mismatches, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn choreographed_orders_survive_crashes_through_nats() {
    fulfil(NATS_URL, Mode::Choreographed, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orchestrated_order_saga_survives_crashes_through_rabbitmq() {
    fulfil(RABBITMQ_URL, Mode::Orchestrated, 13).await;
}
