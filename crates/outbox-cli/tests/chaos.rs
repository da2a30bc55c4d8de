//! Chaos end to end (see `chaos/mod.rs` and `docs/reliability.md`): three `outbox relay`
//! processes, a private PostgreSQL (or MariaDB) and a private NATS JetStream, relays killed and
//! paused, the broker hung (SIGSTOP: no answers), the broker and the database crashed and
//! restarted, and an independent consumer. Asserts no loss (G1), no phantom (G2) and
//! per-aggregate order (G4).
//!
//! Short run (CI, part of `cargo test --workspace`, about a minute):
//! `cargo test -p outbox-cli --test chaos -- --nocapture`.
//! Long run: `OUTBOX_CHAOS_SECS=600 cargo test -p outbox-cli --test chaos -- --nocapture`;
//! replay a schedule with `OUTBOX_CHAOS_SEED=0x…`; against the shared RabbitMQ (own exchange
//! and queues, never restarted) with `OUTBOX_CHAOS_BROKER=rabbitmq`.

#[path = "chaos/mod.rs"]
mod chaos;

use std::{io::Write, time::Instant};

/// The two runs take the machine's cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_keep_g1_g2_g4_through_kills_pauses_and_broker_and_database_crashes() {
    let _turn = ONE_AT_A_TIME.lock().await;
    run_and_check(chaos::Settings::from_env()).await;
}

/// The same in CDC mode: one relay streams the slot, the others stand by; a kill or a pause
/// of the streamer is a takeover, a database crash ends the stream. The writers use the write
/// mode the seed picks (`OUTBOX_CHAOS_WRITE_MODE` to choose). `OUTBOX_CHAOS_SECS` sets its
/// length too (default 40 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdc_relays_keep_g1_g2_g4_through_kills_pauses_and_broker_and_database_crashes() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut settings = chaos::Settings::from_env().cdc();
    if std::env::var_os("OUTBOX_CHAOS_SECS").is_none() {
        settings.duration = std::time::Duration::from_secs(40);
    }
    run_and_check(settings).await;
}

/// The same on a private MariaDB (`mariadbd` crashed and restarted): polling relays on a
/// MySQL-family outbox, fenced by their leases without `RETURNING`, with `outbox purge`
/// (deleting, then archiving) running throughout beside them and the writers. `OUTBOX_CHAOS_SECS` sets
/// its length too (default 40 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_relays_keep_g1_g2_g4_through_kills_pauses_and_broker_and_database_crashes() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut settings = chaos::Settings::from_env().mariadb();
    if std::env::var_os("OUTBOX_CHAOS_SECS").is_none() {
        settings.duration = std::time::Duration::from_secs(40);
    }
    run_and_check(settings).await;
}

async fn run_and_check(settings: chaos::Settings) {
    let started = Instant::now();
    let outcome = chaos::run(&settings).await;
    let f = &outcome.figures;
    // Straight to stderr, past the test harness's capture: CI logs show the counts.
    let _ = writeln!(
        std::io::stderr(),
        "\nchaos end to end, {:?} on {:?}, mode {:?}, writes {:?}: seed {:#x}, {:?} of chaos, {} \
         relays, wall {:.1} s\n{f}",
        settings.broker,
        settings.database,
        settings.source,
        settings.writer.write_mode,
        settings.seed,
        settings.duration,
        settings.relays,
        started.elapsed().as_secs_f64()
    );
    let replay = format!(
        "replay with OUTBOX_CHAOS_SEED={:#x} OUTBOX_CHAOS_SECS={}; relay logs in {}",
        settings.seed,
        settings.duration.as_secs(),
        outcome.log_dir.display()
    );
    for (what, list) in [
        ("lost", &f.lost),
        ("phantom", &f.phantoms.0),
        ("ledger mismatch", &f.ledger_mismatches),
        ("business mismatch", &f.business_mismatches),
    ] {
        for item in list.iter().take(20) {
            println!("  {what}: {item}");
        }
    }

    assert!(f.committed > 0, "the writers committed nothing; {replay}");
    assert!(
        f.ledger_mismatches.is_empty() && f.business_mismatches.is_empty(),
        "the database does not hold what the writers committed (not the relay's doing); {replay}"
    );
    assert!(
        outcome.drained,
        "{} committed events never reached the stream; {replay}",
        f.lost.len()
    );
    assert_eq!(f.lost.len(), 0, "lost events (G1); {replay}");
    assert_eq!(f.phantoms.0.len(), 0, "phantom events (G2); {replay}");
    assert_eq!(f.order_violations, 0, "order violations (G4); {replay}");
    assert_eq!(f.unpublished, 0, "rows left unpublished; {replay}");
    assert!(
        outcome.verify.0,
        "outbox verify is not clean:\n{}\n{replay}",
        outcome.verify.1
    );
    assert!(
        outcome.unclean_exits.is_empty(),
        "relays did not stop cleanly on SIGTERM: {:?}; {replay}",
        outcome.unclean_exits
    );
    assert!(
        !settings.purge || f.purges.ran > 0,
        "the purge never ran: {:?}",
        f.purges
    );
    // The schedule starts with one fault of each kind: every run has them all (the shared
    // RabbitMQ is never restarted).
    let private_broker = settings.broker == chaos::broker::BrokerKind::Nats;
    assert!(
        f.faults.kills >= 1
            && f.faults.pauses >= 1
            && ((f.faults.broker_restarts >= 1 && f.faults.broker_hangs >= 1) || !private_broker)
            && f.faults.database_restarts >= 1,
        "not every kind of fault was injected: {:?}",
        f.faults
    );
    outcome.cleanup();
}
