//! The order saga end to end on PostgreSQL and a real broker, orchestrated and choreographed,
//! with crashes injected: relays and consumers killed abruptly, steps failing after their
//! writes, the saga's timeout steps failing once each, and (on a PostgreSQL of its own) the
//! database restarted mid-flow. Every order must end completed or cancelled, no stock left
//! reserved for a cancelled order, no step applied twice.

use std::{io::Write, sync::Arc};

use outbox_example_orders::fulfilment::{run, DatabaseRestart, Mode, Report, Scenario};
use outbox_testkit::{database_url, PrivatePostgres, NATS_URL, RABBITMQ_URL};

const ORDERS: u32 = 120;

/// Orders among the first `ORDERS` whose number ends in `digit` (see `Ticket::nth`).
fn ending_in(digit: u32) -> i64 {
    (0..ORDERS).filter(|n| n % 10 == digit).count() as i64
}

async fn fulfil(broker_url: &str, mode: Mode, seed: u64) -> Report {
    fulfil_on(&database_url(), None, broker_url, mode, seed).await
}

async fn fulfil_on(
    database_url: &str,
    restart_database: Option<DatabaseRestart>,
    broker_url: &str,
    mode: Mode,
    seed: u64,
) -> Report {
    let scenario = Scenario {
        seed,
        restart_database,
        ..Scenario::new(database_url, broker_url, mode, ORDERS)
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
    if mode == Mode::Orchestrated {
        // Each back-order's first timeout step failed, and was retried to its cancellation.
        // More may have: an order slowed by the database restart past its inventory deadline
        // times out too (its first timeout step fails, and its retry finds it moved on).
        assert!(
            report.timeout_step_failures as i64 >= ending_in(7),
            "{report}"
        );
    }
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

/// On a PostgreSQL of its own, restarted a third of the way through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orchestrated_order_saga_survives_crashes_and_a_database_restart_through_rabbitmq() {
    let report = fulfil_restarting(RABBITMQ_URL, 13).await;
    assert_eq!(report.saga_mismatches, 0);
}

/// Through Kafka: every event type on a topic of its own, so one order's events span topics
/// that Kafka does not order between; consumer groups of the run's own; on a PostgreSQL of
/// its own, restarted a third of the way through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orchestrated_order_saga_survives_crashes_and_a_database_restart_through_kafka() {
    let brokers =
        std::env::var("OUTBOX_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let report = fulfil_restarting(&format!("kafka://{brokers}"), 15).await;
    assert_eq!(report.saga_mismatches, 0);
}

/// The same run on a PostgreSQL of its own, restarted (crashed, then started again) a third of
/// the way through the orders: relays, consumers, the saga's timeouts and the writer wait it
/// out, and the end state is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orchestrated_order_saga_survives_a_database_restart_through_nats() {
    let report = fulfil_restarting(NATS_URL, 14).await;
    assert_eq!(report.saga_mismatches, 0);
}

/// An orchestrated run through `broker_url` on a private PostgreSQL restarted once mid-flow.
async fn fulfil_restarting(broker_url: &str, seed: u64) -> Report {
    let server = Arc::new(tokio::sync::Mutex::new(PrivatePostgres::start().await));
    let url = server.lock().await.url();
    let restart = {
        let server = server.clone();
        DatabaseRestart(Arc::new(move || {
            let server = server.clone();
            Box::pin(async move {
                let mut server = server.lock().await;
                server.crash();
                server.start_again().await;
            })
        }))
    };
    let report = fulfil_on(&url, Some(restart), broker_url, Mode::Orchestrated, seed).await;
    assert_eq!(report.database_restarts, 1, "{report}");
    report
}
