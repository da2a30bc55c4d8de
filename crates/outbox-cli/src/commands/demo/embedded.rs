//! The embedded default of `outbox demo`: SQLite for the outbox and the shop, the relay
//! publishing through its webhook publisher to the demo's own consumers over loopback HTTP.

use std::{
    path::PathBuf,
    process::ExitCode,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressStyle};
use outbox::{
    sqlite::{SqliteInbox, SqliteOutbox},
    Tables,
};
use outbox_relay::{
    publishers::webhook::{WebhookConfig, WebhookPublisher},
    retry::RetryPolicy,
    routing::RoutingConfig,
    Relay, RelayConfig, RelayHandle,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tokio_util::sync::CancellationToken;

use super::{receiver, report, shop, Args};
use crate::commands::CommandResult;

/// Runs the scenario on the SQLite file at `path`.
pub(super) async fn scenario(args: &Args, path: &PathBuf) -> CommandResult {
    let total = i64::from(args.orders);
    println!("outbox demo: an order service, an inventory and a notifications consumer");
    println!(
        "  storage: SQLite ({}), broker: webhooks over loopback HTTP",
        path.display()
    );
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(30)),
        )
        .await?;
    let tables = Tables::default();
    let outbox = SqliteOutbox::new(tables.clone());
    outbox.migrate(&pool).await?;
    shop::install(&pool).await?;

    let stop = CancellationToken::new();
    let counters = Arc::new(receiver::Counters::default());
    let url = receiver::start(
        pool.clone(),
        SqliteInbox::new(&tables),
        counters.clone(),
        args.drop_ack_every,
        stop.clone(),
    )
    .await?;
    let start_relay = |id: &'static str| {
        let (pool, url) = (pool.clone(), url.clone());
        async move {
            let publisher = Arc::new(WebhookPublisher::new(WebhookConfig {
                url,
                timeout: Duration::from_secs(5),
                ..Default::default()
            })?);
            let config = RelayConfig {
                relay_id: Some(id.into()),
                lease_ttl: Duration::from_secs(2),
                heartbeat_interval: Duration::from_millis(500),
                poll_interval: Duration::from_millis(50),
                stats_interval: Duration::from_millis(500),
                retry: RetryPolicy {
                    initial_backoff: Duration::from_millis(50),
                    max_transient_backoff: Duration::from_millis(500),
                    ..Default::default()
                },
                routing: RoutingConfig::default(),
                ..Default::default()
            };
            Ok::<RelayHandle, Box<dyn std::error::Error>>(
                Relay::sqlite(pool, publisher, config).await?.spawn(),
            )
        }
    };

    let started = Instant::now();
    let relay = start_relay("relay-1").await?;
    let writer = {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        tokio::spawn(async move {
            for n in 0..total {
                shop::place_order(&pool, &outbox, n).await?;
                if n % 10 == 9 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        })
    };

    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("  {bar:40} {pos}/{len} events delivered  {msg}")
            .expect("valid template"),
    );
    let mut relay = Some(relay);
    let mut crashed_at = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let applied = report::applied_events(&pool).await?;
        bar.set_position(applied as u64);
        bar.set_message(format!(
            "({} duplicates discarded)",
            counters.duplicates.load(Ordering::Relaxed)
        ));
        if crashed_at.is_none() && applied >= total * 2 / 5 {
            relay.take().expect("running").abort();
            crashed_at = Some(applied);
            bar.suspend(|| {
                println!(
                    "  relay-1 killed abruptly (as kill -9) after {applied} orders were \
                     delivered; relay-2 takes over when its lease expires"
                )
            });
            relay = Some(start_relay("relay-2").await?);
        }
        if applied >= total && writer.is_finished() {
            break;
        }
        if Instant::now() > deadline {
            bar.abandon_with_message("timed out");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bar.finish();
    writer.await?.map_err(|e| e.to_string())?;
    // The consumers have applied every event, but the relay marks an event published only once
    // acknowledged, in batches, and retries a delivery whose acknowledgement was lost after a
    // backoff: wait for its marks, then stop it, so that nothing changes while counting.
    if !report::all_marked(&pool, Duration::from_secs(30)).await? {
        println!("  timed out waiting for the relay to mark every event published");
    }
    if let Some(relay) = relay {
        relay.shutdown().await?;
    }
    stop.cancel();

    let summary = report::Summary::collect(&pool, &counters, total, started.elapsed()).await?;
    println!(
        "  relay crashes injected: {}",
        u8::from(crashed_at.is_some())
    );
    print!("{summary}");
    Ok(if summary.guarantees_hold() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
