//! `outbox verify`: audit what a broker holds against the outbox. Reports events published by
//! the outbox but missing from the broker (G1), deliveries of one event more than once, and
//! events that reached the broker before an earlier event of their aggregate (G4). Exits 0
//! when clean, 1 when not.
//!
//! Streaming: the broker is read in batches, each looked up in the table by event id, then the
//! table's rows are streamed in id order; memory grows with the aggregates, not the events.

mod audit;
mod brokers;
mod table;

use std::process::ExitCode;

use chrono::{DateTime, Utc};

use super::{CommandResult, DatabaseArgs};
use audit::{Audit, Verdict};
use table::Window;

/// Options of `outbox verify`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The broker: nats://… (reads a stream, non-destructively), amqp://… (consumes a queue:
    /// bind a dedicated audit queue to the exchange for this) or kafka://host:port[,…] (reads
    /// topics from their start, commits nothing).
    #[arg(long, env = "OUTBOX_BROKER_URL", hide_env_values = true)]
    broker_url: String,
    /// JetStream stream to read (NATS).
    #[arg(long, default_value = "OUTBOX")]
    stream: String,
    /// Queue to consume (RabbitMQ).
    #[arg(long)]
    queue: Option<String>,
    /// Topic to read (Kafka; repeatable: every topic the relay routes to).
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// Kafka: a librdkafka property, KEY=VALUE (repeatable; `security.protocol`, `sasl.*`,
    /// `ssl.*`). In the environment, `;`-separated. Values are never printed.
    #[arg(
        long = "kafka-property",
        env = "OUTBOX_KAFKA_PROPERTIES",
        value_delimiter = ';',
        hide_env_values = true
    )]
    kafka_properties: Vec<String>,
    /// Only events that occurred at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<DateTime<Utc>>,
    /// Only events that occurred before this time (RFC 3339).
    #[arg(long)]
    until: Option<DateTime<Utc>>,
    /// How far the database's, the writers' and the broker's clocks may disagree: the broker
    /// is read from this long before --since, and a read ends at a message stored this long
    /// after the audit began.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    clock_skew: std::time::Duration,
    /// Count duplicates as a failure too (at-least-once delivery allows them).
    #[arg(long)]
    strict: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the audit.
pub async fn run(args: Args) -> CommandResult {
    if let (Some(since), Some(until)) = (args.since, args.until) {
        if since >= until {
            return Err(format!("--since {since} must be before --until {until}").into());
        }
    }
    let outbox = super::open_outbox(&args.db).await?;
    let window = Window {
        since: args.since,
        until: args.until,
    };
    let cdc = table::has_cdc(&outbox).await?;
    // Rows marked published up to this instant have their message in the broker before the
    // readers below fix the end they read to.
    let began = table::now(&outbox).await?;
    let skew =
        chrono::Duration::from_std(args.clock_skew).map_err(|_| "--clock-skew is out of range")?;
    let (sender, mut batches) = tokio::sync::mpsc::channel(2);
    let reader = tokio::spawn(brokers::read(
        brokers::Source {
            url: args.broker_url.clone(),
            stream: args.stream.clone(),
            queue: args.queue.clone(),
            topics: args.topics.clone(),
            kafka_properties: args.kafka_properties.clone(),
            since: args.since.map(|t| t - skew),
            until_stamp: began + skew,
        },
        sender,
    ));
    let mut audit = Audit::default();
    while let Some(batch) = batches.recv().await {
        let ids: Vec<_> = batch.iter().filter_map(|s| s.event_id).collect();
        let rows = table::lookup(&outbox, &ids, window).await?;
        for seen in &batch {
            audit.message(seen, seen.event_id.and_then(|id| rows.get(&id)));
        }
    }
    reader
        .await
        .map_err(|e| format!("reading the broker: {e}"))?
        .map_err(|e| -> Box<dyn std::error::Error> { e })?;
    table::scan(&outbox, window, began, &mut audit).await?;
    let verdict = audit.finish();
    let clean = verdict.clean(args.strict);
    if args.json {
        super::print(&format!(
            "{}\n",
            serde_json::to_string_pretty(&Report {
                verdict: &verdict,
                clean,
                cdc_slot: cdc,
            })?
        ));
    } else {
        super::print(&text(&verdict, clean, cdc));
    }
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The JSON report.
#[derive(serde::Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    verdict: &'a Verdict,
    clean: bool,
    /// The outbox has a CDC slot: zero-growth and table-less events leave no row.
    cdc_slot: bool,
}

/// The report for a terminal.
fn text(v: &Verdict, clean: bool, cdc: bool) -> String {
    let mut out = format!(
        "outbox events in window: {} ({} published)\n",
        v.outbox_events, v.published
    );
    if v.published_during_audit > 0 {
        out.push_str(&format!(
            "  published during the audit: {} (not judged: past the end read)\n",
            v.published_during_audit
        ));
    }
    out.push_str(&format!(
        "broker messages read:    {}\n\
         missing from the broker: {}\n\
         duplicates:              {}\n\
         order violations:        {}\n\
         not in the table:        {} (purged, outside the window, or zero-growth/table-less)\n\
         \x20 version regressions:  {}\n\
         \x20 version gaps:         {} (lost events if your aggregate versions have no gaps)\n\
         not outbox messages:     {}\n\
         fan-out copies:          {} (judged apart: a copy does not stand for its event)\n",
        v.broker_messages,
        v.missing_count,
        v.duplicates,
        v.order_violation_count,
        v.not_in_table,
        v.version_regressions,
        v.version_gaps,
        v.not_an_outbox_message,
        v.fan_out_copies,
    ));
    if v.outside_window > 0 {
        out.push_str(&format!(
            "outside the window:      {} (read for clock skew, not judged)\n",
            v.outside_window
        ));
    }
    if v.aggregates_in_several_partitions > 0 {
        out.push_str(&format!(
            "aggregates in several partitions: {} (order judged within each partition only)\n",
            v.aggregates_in_several_partitions
        ));
    }
    if cdc {
        out.push_str(
            "note: this outbox has a CDC slot. Events written in the zero-growth or table-less \
             mode leave no\n      row, so verify cannot tell which of them the broker lacks; \
             it checks them for duplicates\n      and by their aggregate-version header (order, \
             and gaps where versions are contiguous).\n",
        );
    }
    out.push_str(if clean { "clean\n" } else { "NOT CLEAN\n" });
    for id in v.missing.iter().take(20) {
        out.push_str(&format!("  missing: {id}\n"));
    }
    for id in v.order_violations.iter().take(20) {
        out.push_str(&format!("  out of order: {id}\n"));
    }
    out
}
