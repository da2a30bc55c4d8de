//! `outbox verify`: audit what a broker holds against the outbox. Reports events published by
//! the outbox but missing from the broker (G1), deliveries of one event more than once, and
//! events that reached the broker before an earlier event of their aggregate (G4). Exits 0
//! when clean, 1 when not.

use std::{
    collections::{BTreeMap, HashMap},
    process::ExitCode,
};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use uuid::Uuid;

use super::{CommandResult, DatabaseArgs, Db};

/// Options of `outbox verify`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The broker: nats://… (reads a stream, non-destructively) or amqp://… (consumes a queue:
    /// bind a dedicated audit queue to the exchange for this).
    #[arg(long, env = "OUTBOX_BROKER_URL", hide_env_values = true)]
    broker_url: String,
    /// JetStream stream to read (NATS).
    #[arg(long, default_value = "OUTBOX")]
    stream: String,
    /// Queue to consume (RabbitMQ).
    #[arg(long)]
    queue: Option<String>,
    /// Only events that occurred at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<DateTime<Utc>>,
    /// Only events that occurred before this time (RFC 3339).
    #[arg(long)]
    until: Option<DateTime<Utc>>,
    /// Count duplicates as a failure too (at-least-once delivery allows them).
    #[arg(long)]
    strict: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// One message as the broker holds it.
struct Seen {
    event_id: Uuid,
}

/// The verdict.
#[derive(Debug, Default, serde::Serialize)]
struct Verdict {
    outbox_events: usize,
    published: usize,
    broker_messages: usize,
    missing: Vec<Uuid>,
    duplicates: usize,
    order_violations: Vec<Uuid>,
    unknown_to_outbox: usize,
    not_an_outbox_message: usize,
}

/// Runs the audit.
pub async fn run(args: Args) -> CommandResult {
    if let (Some(since), Some(until)) = (args.since, args.until) {
        if since >= until {
            return Err(format!("--since {since} must be before --until {until}").into());
        }
    }
    let outbox = super::open_outbox(&args.db).await?;
    // event id → (row id, aggregate key, published?)
    let mut events: HashMap<Uuid, (i64, (String, String), bool)> = HashMap::new();
    for row in outbox_rows(&outbox, args.since, args.until).await? {
        events.insert(
            row.event_id,
            (
                row.id,
                (row.aggregate_type, row.aggregate_id),
                row.published,
            ),
        );
    }
    let (messages, foreign) = if args.broker_url.starts_with("nats://") {
        read_nats(&args).await?
    } else if args.broker_url.starts_with("amqp://") || args.broker_url.starts_with("amqps://") {
        read_rabbitmq(&args).await?
    } else {
        return Err("--broker-url must be nats://… or amqp://…".into());
    };

    let mut verdict = Verdict {
        outbox_events: events.len(),
        published: events.values().filter(|v| v.2).count(),
        broker_messages: messages.len() + foreign,
        not_an_outbox_message: foreign,
        ..Default::default()
    };
    let mut delivered: HashMap<Uuid, usize> = HashMap::new();
    let mut last: HashMap<&(String, String), i64> = HashMap::new();
    for m in &messages {
        let count = delivered.entry(m.event_id).or_insert(0);
        *count += 1;
        if *count > 1 {
            verdict.duplicates += 1;
            continue;
        }
        let Some((id, key, _)) = events.get(&m.event_id) else {
            verdict.unknown_to_outbox += 1;
            continue;
        };
        let previous = last.entry(key).or_insert(0);
        if *id < *previous {
            verdict.order_violations.push(m.event_id);
        }
        *previous = (*previous).max(*id);
    }
    let mut missing: BTreeMap<i64, Uuid> = BTreeMap::new();
    for (event_id, (id, _, published)) in &events {
        if *published && !delivered.contains_key(event_id) {
            missing.insert(*id, *event_id);
        }
    }
    verdict.missing = missing.into_values().collect();
    let clean = verdict.missing.is_empty()
        && verdict.order_violations.is_empty()
        && (!args.strict || verdict.duplicates == 0);
    if args.json {
        super::print(&format!("{}\n", serde_json::to_string_pretty(&verdict)?));
    } else {
        super::print(&format!(
            "outbox events in window: {} ({} published)\nbroker messages read:    {}\n\
             missing from the broker: {}\nduplicates:              {}\norder violations:        {}\n\
             unknown to the outbox:   {} (purged, or outside the window)\n\
             not outbox messages:     {}\n{}\n",
            verdict.outbox_events,
            verdict.published,
            verdict.broker_messages,
            verdict.missing.len(),
            verdict.duplicates,
            verdict.order_violations.len(),
            verdict.unknown_to_outbox,
            verdict.not_an_outbox_message,
            if clean { "clean" } else { "NOT CLEAN" }
        ));
        for id in verdict.missing.iter().take(20) {
            super::print(&format!("  missing: {id}\n"));
        }
        for id in verdict.order_violations.iter().take(20) {
            super::print(&format!("  out of order: {id}\n"));
        }
    }
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// One outbox row as the audit reads it.
struct Row {
    id: i64,
    event_id: Uuid,
    aggregate_type: String,
    aggregate_id: String,
    published: bool,
}

/// The outbox's rows that occurred in the window, in id order. On SQLite, a row whose event
/// id is not a UUID (dead-lettered for it, never published) is left out.
async fn outbox_rows(
    outbox: &super::Outbox,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let tables = &outbox.tables;
    let rows = match &outbox.db {
        Db::Postgres(pool) => sqlx::query(&tables.render(
            "SELECT id, event_id::text AS event_id, aggregate_type, aggregate_id, status
                 FROM {schema}.{events}
                 WHERE ($1::timestamptz IS NULL OR occurred_at >= $1)
                   AND ($2::timestamptz IS NULL OR occurred_at < $2)
                 ORDER BY id",
        ))
        .bind(since)
        .bind(until)
        .fetch_all(pool)
        .await?
        .iter()
        .map(read_row)
        .collect::<Result<Vec<_>, _>>()?,
        Db::MySql(pool) => {
            let time = |t: Option<DateTime<Utc>>| t.map(|t| t.naive_utc());
            sqlx::query(&tables.render_mysql(
                // The keys' binary collation reaches the client as bytes: converted to text.
                "SELECT id, event_id, CONVERT(aggregate_type USING utf8mb4) AS aggregate_type,
                        CONVERT(aggregate_id USING utf8mb4) AS aggregate_id, status
                 FROM {events}
                 WHERE (? IS NULL OR occurred_at >= ?) AND (? IS NULL OR occurred_at < ?)
                 ORDER BY id",
            ))
            .bind(time(since))
            .bind(time(since))
            .bind(time(until))
            .bind(time(until))
            .fetch_all(pool)
            .await?
            .iter()
            .map(read_row)
            .collect::<Result<Vec<_>, _>>()?
        }
        Db::Sqlite(pool) => {
            let time = |t: Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339());
            sqlx::query(&tables.render_sqlite(
                "SELECT id, CAST(event_id AS TEXT) AS event_id, aggregate_type, aggregate_id,
                        status
                 FROM {events}
                 WHERE (?1 IS NULL OR julianday(occurred_at) >= julianday(?1))
                   AND (?2 IS NULL OR julianday(occurred_at) < julianday(?2))
                 ORDER BY id",
            ))
            .bind(time(since))
            .bind(time(until))
            .fetch_all(pool)
            .await?
            .iter()
            .map(read_row)
            .collect::<Result<Vec<_>, _>>()?
        }
    };
    Ok(rows.into_iter().flatten().collect())
}

fn read_row<R: sqlx::Row>(r: &R) -> Result<Option<Row>, sqlx::Error>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'v> String: sqlx::Decode<'v, R::Database> + sqlx::Type<R::Database>,
    for<'v> i64: sqlx::Decode<'v, R::Database> + sqlx::Type<R::Database>,
{
    let event_id: String = r.try_get("event_id")?;
    let Ok(event_id) = Uuid::parse_str(&event_id) else {
        return Ok(None);
    };
    let status: String = r.try_get("status")?;
    Ok(Some(Row {
        id: r.try_get("id")?,
        event_id,
        aggregate_type: r.try_get("aggregate_type")?,
        aggregate_id: r.try_get("aggregate_id")?,
        published: status == "published",
    }))
}

fn event_id_of(value: Option<&str>) -> Option<Uuid> {
    value.and_then(|v| Uuid::parse_str(v).ok())
}

#[cfg(not(feature = "nats"))]
async fn read_nats(_: &Args) -> Result<(Vec<Seen>, usize), Box<dyn std::error::Error>> {
    Err("this build of outbox cannot read NATS: build it with the cargo feature `nats`".into())
}

#[cfg(not(feature = "rabbitmq"))]
async fn read_rabbitmq(_: &Args) -> Result<(Vec<Seen>, usize), Box<dyn std::error::Error>> {
    Err(
        "this build of outbox cannot read RabbitMQ: build it with the cargo feature `rabbitmq`"
            .into(),
    )
}

/// Reads the whole stream (from `--since` when given), without consuming it.
#[cfg(feature = "nats")]
async fn read_nats(args: &Args) -> Result<(Vec<Seen>, usize), Box<dyn std::error::Error>> {
    use async_nats::jetstream::{self, consumer};
    let js = jetstream::new(async_nats::connect(&args.broker_url).await?);
    let mut stream = js.get_stream(&args.stream).await?;
    let last = stream.info().await?.state.last_sequence;
    let mut out = Vec::new();
    let mut foreign = 0;
    if last == 0 {
        return Ok((out, foreign));
    }
    let deliver_policy = match args.since {
        Some(t) => consumer::DeliverPolicy::ByStartTime {
            start_time: time::OffsetDateTime::from_unix_timestamp(t.timestamp())?,
        },
        None => consumer::DeliverPolicy::All,
    };
    let reader = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy,
            ..Default::default()
        })
        .await?;
    let mut messages = reader.messages().await?;
    while let Some(message) =
        tokio::time::timeout(std::time::Duration::from_secs(5), messages.next())
            .await
            .map_err(|_| "timed out reading the stream")?
    {
        let message = message?;
        let id = event_id_of(
            message
                .headers
                .as_ref()
                .and_then(|h| h.get("event-id"))
                .map(|v| v.as_str()),
        );
        match id {
            Some(event_id) => out.push(Seen { event_id }),
            None => foreign += 1,
        }
        if message
            .info()
            .map(|i| i.stream_sequence >= last)
            .unwrap_or(true)
        {
            break;
        }
    }
    Ok((out, foreign))
}

/// Consumes the audit queue until it is empty.
#[cfg(feature = "rabbitmq")]
async fn read_rabbitmq(args: &Args) -> Result<(Vec<Seen>, usize), Box<dyn std::error::Error>> {
    use lapin::{
        options::{BasicAckOptions, BasicGetOptions},
        types::AMQPValue,
        Connection, ConnectionProperties,
    };
    let queue = args
        .queue
        .as_deref()
        .ok_or("--queue is required with amqp:// (a dedicated audit queue: verify consumes it)")?;
    let connection = Connection::connect(&args.broker_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let mut out = Vec::new();
    let mut foreign = 0;
    while let Some(message) = channel.basic_get(queue, BasicGetOptions::default()).await? {
        let header = message
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|t| t.inner().get("event-id").cloned());
        let id = match header {
            Some(AMQPValue::LongString(s)) => event_id_of(std::str::from_utf8(s.as_bytes()).ok()),
            _ => None,
        };
        match id {
            Some(event_id) => out.push(Seen { event_id }),
            None => foreign += 1,
        }
        message.delivery.ack(BasicAckOptions::default()).await?;
    }
    Ok((out, foreign))
}
