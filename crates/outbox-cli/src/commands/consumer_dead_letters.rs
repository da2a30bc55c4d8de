//! `outbox consumer-dead-letters list | replay`: the dead letters of an `outbox-consumer`
//! runner, on the broker where it put them (NATS stream `{stream}_DEAD_{consumer}`, RabbitMQ
//! queue `{queue}.dead`, Kafka topic `{consumer}.dead`). Replays are recorded in the outbox's
//! audit table.

use outbox_consumer::dead_letters::{DeadLetter, Replayed, Selection};

use super::{connect, print, require_url, CommandResult, DatabaseArgs};
use crate::escape;

/// A replay that a broker failure stopped part-way (the cause follows in the error's chain).
#[derive(Debug, thiserror::Error)]
#[error("the replay stopped early")]
struct StoppedEarly(#[source] outbox_consumer::dead_letters::Error);

/// Options of `outbox consumer-dead-letters`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// List a consumer's dead letters, in the order they were dead-lettered.
    List {
        #[command(flatten)]
        source: Source,
        #[command(flatten)]
        filter: Filter,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Publish dead letters back to the consumer (deploy its fix first); each is removed from
    /// the dead letters once the broker confirms it. Audited in the outbox database.
    Replay {
        #[command(flatten)]
        source: Source,
        #[command(flatten)]
        filter: Filter,
        /// Replay every dead letter when no --event-id or --reason-contains is given.
        #[arg(long)]
        all: bool,
        /// Show what would be replayed, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// The database whose audit table records the replay (the consumer's inbox database).
        #[command(flatten)]
        db: DatabaseArgs,
        /// Why (recorded in the audit table).
        #[arg(long, default_value = "replay")]
        reason: String,
        /// Who (recorded in the audit table).
        #[arg(long, env = "USER", default_value = "unknown")]
        actor: String,
    },
}

/// Where the dead letters are.
#[derive(clap::Args, Debug)]
struct Source {
    /// nats://…, amqp://… or kafka://host:port[,host:port…] (not printed: it may hold a
    /// password).
    #[arg(long, env = "OUTBOX_BROKER_URL", hide_env_values = true)]
    broker_url: String,
    /// NATS, Kafka: the consumer's name.
    #[arg(long)]
    consumer: Option<String>,
    /// Kafka: the dead-letter topic, when not `{consumer}.dead`.
    #[arg(long)]
    topic: Option<String>,
    /// Kafka: a librdkafka property, KEY=VALUE (repeatable; `security.protocol`, `sasl.*`,
    /// `ssl.*`). In the environment, `;`-separated. Values are never printed.
    #[arg(
        long = "kafka-property",
        env = "OUTBOX_KAFKA_PROPERTIES",
        value_delimiter = ';',
        hide_env_values = true
    )]
    kafka_properties: Vec<String>,
    /// NATS: the stream the consumer reads.
    #[arg(long, default_value = "OUTBOX")]
    stream: String,
    /// RabbitMQ: the queue the consumer reads (its dead letters are `{queue}.dead`).
    #[arg(long)]
    queue: Option<String>,
}

/// Which dead letters.
#[derive(clap::Args, Debug)]
struct Filter {
    /// Event ids (repeatable).
    #[arg(long = "event-id")]
    event_ids: Vec<String>,
    /// Only those whose reason contains this text (case-insensitive).
    #[arg(long)]
    reason_contains: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

impl Filter {
    fn selection(&self) -> Selection {
        Selection {
            event_ids: self.event_ids.clone(),
            reason_contains: self.reason_contains.clone(),
            limit: self.limit,
        }
    }
}

/// The dead letters of one consumer, on either broker.
enum Letters {
    #[cfg(feature = "nats")]
    Nats(Box<outbox_consumer::dead_letters::nats::NatsDeadLetters>),
    #[cfg(feature = "rabbitmq")]
    RabbitMq(Box<outbox_consumer::dead_letters::rabbitmq::RabbitMqDeadLetters>),
    #[cfg(feature = "kafka")]
    Kafka(Box<outbox_consumer::dead_letters::kafka::KafkaDeadLetters>),
}

impl Letters {
    async fn open(source: &Source) -> Result<(Self, String), Box<dyn std::error::Error>> {
        let url = source.broker_url.as_str();
        if url.starts_with("nats://") || url.starts_with("tls://") {
            #[cfg(feature = "nats")]
            {
                let consumer = source
                    .consumer
                    .as_deref()
                    .ok_or("--consumer is required with nats:// (the consumer's name)")?;
                let letters = outbox_consumer::dead_letters::nats::NatsDeadLetters::open(
                    url,
                    &source.stream,
                    consumer,
                )
                .await?;
                return Ok((Self::Nats(Box::new(letters)), consumer.to_owned()));
            }
            #[cfg(not(feature = "nats"))]
            return Err(
                "this build of outbox has no NATS: build it with the cargo feature `nats`".into(),
            );
        }
        if url.starts_with("amqp://") || url.starts_with("amqps://") {
            #[cfg(feature = "rabbitmq")]
            {
                let queue = source
                    .queue
                    .as_deref()
                    .ok_or("--queue is required with amqp:// (the queue the consumer reads)")?;
                let letters =
                    outbox_consumer::dead_letters::rabbitmq::RabbitMqDeadLetters::open(url, queue)
                        .await?;
                return Ok((Self::RabbitMq(Box::new(letters)), queue.to_owned()));
            }
            #[cfg(not(feature = "rabbitmq"))]
            return Err(
                "this build of outbox has no RabbitMQ: build it with the cargo feature `rabbitmq`"
                    .into(),
            );
        }
        if url.starts_with("kafka://") {
            let brokers = super::kafka_brokers(url)?;
            #[cfg(feature = "kafka")]
            {
                let consumer = source
                    .consumer
                    .as_deref()
                    .ok_or("--consumer is required with kafka:// (the consumer's name)")?;
                let topic = source
                    .topic
                    .clone()
                    .unwrap_or_else(|| format!("{consumer}.dead"));
                let properties = super::kafka_properties(&source.kafka_properties)?;
                let letters = outbox_consumer::dead_letters::kafka::KafkaDeadLetters::open_with(
                    brokers,
                    &topic,
                    &properties,
                )
                .await?;
                return Ok((Self::Kafka(Box::new(letters)), consumer.to_owned()));
            }
            #[cfg(not(feature = "kafka"))]
            {
                let _ = brokers;
                return Err(
                    "this build of outbox has no Kafka: build it with the cargo feature `kafka`"
                        .into(),
                );
            }
        }
        Err("--broker-url must be nats://…, amqp://… or kafka://…".into())
    }

    fn source(&self) -> String {
        match self {
            #[cfg(feature = "nats")]
            Self::Nats(l) => l.source(),
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(l) => l.source(),
            #[cfg(feature = "kafka")]
            Self::Kafka(l) => l.source(),
        }
    }

    async fn list(
        &self,
        selection: &Selection,
    ) -> Result<Vec<DeadLetter>, Box<dyn std::error::Error>> {
        Ok(match self {
            #[cfg(feature = "nats")]
            Self::Nats(l) => l.list(selection).await?,
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(l) => l.list(selection).await?,
            #[cfg(feature = "kafka")]
            Self::Kafka(l) => l.list(selection).await?,
        })
    }

    async fn replay(&self, selection: &Selection) -> Result<Replayed, Box<dyn std::error::Error>> {
        Ok(match self {
            #[cfg(feature = "nats")]
            Self::Nats(l) => l.replay(selection).await?,
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(l) => l.replay(selection).await?,
            #[cfg(feature = "kafka")]
            Self::Kafka(l) => l.replay(selection).await?,
        })
    }
}

/// Runs the action.
pub async fn run(args: Args) -> CommandResult {
    match args.action {
        Action::List {
            source,
            filter,
            json,
        } => {
            let (letters, _) = Letters::open(&source).await?;
            let listed = letters.list(&filter.selection()).await?;
            if json {
                print(&format!("{}\n", serde_json::to_string_pretty(&listed)?));
            } else {
                print(&table(&letters.source(), &listed));
            }
        }
        Action::Replay {
            source,
            filter,
            all,
            dry_run,
            db,
            reason,
            actor,
        } => {
            if filter.event_ids.is_empty() && filter.reason_contains.is_none() && !all {
                return Err("replay needs --event-id, --reason-contains, or --all".into());
            }
            let (letters, consumer) = Letters::open(&source).await?;
            let selection = filter.selection();
            if dry_run {
                let listed = letters.list(&selection).await?;
                print(&format!("would replay {} dead letter(s):\n", listed.len()));
                print(&table(&letters.source(), &listed));
                return Ok(std::process::ExitCode::SUCCESS);
            }
            // The audit database first: a replay that cannot be recorded does not start.
            let tables = db.tables()?;
            let pool = connect(require_url(db.database_url.as_deref())?, 1).await?;
            let Replayed {
                letters: replayed,
                failure,
            } = letters.replay(&selection).await?;
            if !replayed.is_empty() {
                outbox_consumer::dead_letters::record_replay(
                    &pool,
                    &tables,
                    &consumer,
                    &letters.source(),
                    &replayed,
                    &actor,
                    &reason,
                )
                .await?;
            }
            print(&format!(
                "replayed {} dead letter(s) of {} ({}), audited\n",
                replayed.len(),
                consumer,
                letters.source()
            ));
            if let Some(failure) = failure {
                return Err(StoppedEarly(failure).into());
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// The dead letters as a table; what the broker delivered has its control characters escaped.
fn table(source: &str, letters: &[DeadLetter]) -> String {
    let mut out = format!("{} dead letter(s) in {source}\n", letters.len());
    if letters.is_empty() {
        return out;
    }
    use crate::table::{render, Align::*};
    let rows = letters.iter().map(|l| {
        vec![
            escape::control(l.event_id.as_deref().unwrap_or("-")).into_owned(),
            escape::control(l.event_type.as_deref().unwrap_or("-")).into_owned(),
            l.attempts.to_string(),
            escape::control(&l.origin).into_owned(),
            escape::control(&l.reason).into_owned(),
        ]
    });
    out.push_str(&render(
        &[
            ("event id", Left),
            ("event type", Left),
            ("attempts", Right),
            ("origin", Left),
            ("reason", Left),
        ],
        rows,
    ));
    out
}
