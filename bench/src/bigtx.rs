//! (i) `bigtx`: one transaction of large events (`--big-tx-mb` MiB of 512 KiB payloads),
//! written while the relay runs, on `--cdc-database-url`: the relay's peak RSS next to its RSS
//! just before, for polling (the table, read in batches with a byte budget) and for CDC
//! zero-growth (the whole transaction arrives from the slot at its commit and is cut in chunks
//! of bytes). A relay that held such a transaction whole would need at least its size.

use std::time::{Duration, Instant};

use outbox::{
    postgres::{cdc, PgOutbox, WriteMode},
    Event, Outbox,
};

use crate::{
    common::{interruptible, Result, Scope},
    context::Bench,
    process::{RelayProcess, RelayStats},
};

/// Payload of each event: large, and under NATS's default 1 MiB message limit.
const PAYLOAD_BYTES: usize = 512 << 10;

/// Figures of one mode.
#[derive(Clone, Debug)]
pub struct BigTx {
    /// `poll` or `cdc zero-growth`.
    pub name: &'static str,
    /// Events in the transaction.
    pub events: u64,
    /// Payload bytes in the transaction.
    pub bytes: u64,
    /// From the commit to every event in the stream.
    pub delivery: Duration,
    /// The relay's RSS once it published a first small event, before the transaction, MB.
    pub rss_before_mb: f64,
    /// The relay process over the run (peak RSS, exit).
    pub relay: RelayStats,
    /// Relay CPU seconds spent on the transaction.
    pub cpu_seconds: f64,
}

/// Runs polling, then CDC zero-growth, each in its own schema, slot and stream.
pub async fn run(bench: &Bench) -> Result<Vec<BigTx>> {
    let mut out = Vec::new();
    for (scenario, is_cdc, mode, name) in [
        ("bigtx_poll", false, WriteMode::Table, "poll"),
        ("bigtx_zero", true, WriteMode::ZeroGrowth, "cdc zero-growth"),
    ] {
        let mut scope = bench.scope(scenario)?;
        scope.cdc = is_cdc;
        let names = cdc::CdcNames::for_tables(&scope.tables);
        let result = interruptible(async {
            bench.create_outbox(&scope).await?;
            if is_cdc {
                cdc::setup(&bench.pool, &scope.tables, &names).await?;
            }
            bench.create_stream(&scope).await?;
            bench.settle(scenario).await;
            one(bench, &scope, mode, name).await
        })
        .await;
        if is_cdc {
            if let Err(e) = cdc::drop(&bench.pool, &scope.tables, &names).await {
                bench.log(scenario, format!("could not drop the slot: {e}"));
            }
        }
        bench.cleanup(&scope).await;
        out.push(result?);
    }
    Ok(out)
}

async fn one(bench: &Bench, scope: &Scope, mode: WriteMode, name: &'static str) -> Result<BigTx> {
    let outbox = PgOutbox::new(scope.tables.clone())
        .write_mode(mode)
        .notify(!scope.cdc);
    let mut relay = RelayProcess::start(bench, scope).await?;
    // The relay is up, streaming or polling, once a first small event arrives.
    let mut tx = bench.pool.begin().await?;
    outbox
        .enqueue(&mut tx, &Event::new("probe", "0", "Probe").json(&1)?)
        .await?;
    tx.commit().await?;
    wait_for(bench, scope, &mut relay, 1).await?;
    let rss_before_mb = relay.rss_mb().unwrap_or(0.0);
    let cpu_before = relay.cpu_seconds();

    let events = (bench.options.big_tx_mb * 2).max(1);
    let blob = "x".repeat(PAYLOAD_BYTES - 16);
    bench.log(
        scope.scenario,
        format!("{name}: one transaction of {events} events of 512 KiB"),
    );
    let mut tx = bench.pool.begin().await?;
    // In statements of 128 events: one statement's arrays must stay under PostgreSQL's 1 GB
    // limit for a value.
    for first in (0..events).step_by(128) {
        let batch: Vec<Event> = (first..(first + 128).min(events))
            .map(|i| {
                Event::new("order", format!("big-{}", i % 100), "OrderPlaced")
                    .json(&serde_json::json!({ "blob": blob }))
            })
            .collect::<std::result::Result<_, _>>()?;
        outbox.enqueue_batch(&mut tx, &batch).await?;
    }
    tx.commit().await?;
    let committed = Instant::now();
    wait_for(bench, scope, &mut relay, 1 + events).await?;
    let delivery = committed.elapsed();
    let cpu_seconds = relay.cpu_seconds() - cpu_before;
    let relay = relay.stop().await?;
    bench.log(
        scope.scenario,
        format!(
            "{name}: delivered in {:.1}s; relay RSS {rss_before_mb:.1} MB before, peak {:.1} MB",
            delivery.as_secs_f64(),
            relay.peak_rss_mb
        ),
    );
    Ok(BigTx {
        name,
        events,
        bytes: events * PAYLOAD_BYTES as u64,
        delivery,
        rss_before_mb,
        relay,
        cpu_seconds,
    })
}

/// Waits until the stream holds `n` messages, failing if the relay exits or the drain
/// timeout passes.
async fn wait_for(bench: &Bench, scope: &Scope, relay: &mut RelayProcess, n: u64) -> Result<()> {
    let timeout = Duration::from_secs(bench.options.drain_timeout);
    let started = Instant::now();
    while bench.stream_messages(scope).await? < n {
        relay.check_alive()?;
        if started.elapsed() > timeout {
            return Err(format!(
                "{}: {n} messages not in the stream after {timeout:?}",
                scope.scenario
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The results as a Markdown table.
pub fn render(results: &[BigTx]) -> String {
    let mut text = String::from(
        "| mode | transaction | commit to last event in the stream | relay RSS before | relay peak RSS | peak / transaction size | relay CPU |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in results {
        let mb = r.bytes as f64 / (1 << 20) as f64;
        text.push_str(&format!(
            "| {} | {} events, {:.0} MiB | {:.1} s | {:.1} MB | **{:.1} MB** | {:.2} | {:.1} s ({:.0} µs per event) |\n",
            r.name,
            r.events,
            mb,
            r.delivery.as_secs_f64(),
            r.rss_before_mb,
            r.relay.peak_rss_mb,
            r.relay.peak_rss_mb / mb,
            r.cpu_seconds,
            r.cpu_seconds * 1e6 / r.events as f64,
        ));
    }
    text
}
