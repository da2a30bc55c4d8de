//! The benchmark context (connections, run id, options): per-scenario outbox schemas and
//! backlogs, JetStream streams, Kafka topics and RabbitMQ queues, and the machine's facts.

use std::{
    path::{Path, PathBuf},
    str::FromStr,
    time::{Duration, Instant},
};

use async_nats::jetstream::{self, stream};
use outbox::{
    postgres::{MigrateOptions, PgOutbox},
    Outbox, Tables,
};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};

use crate::{
    common::{Result, Scope, PAYLOAD_SQL},
    kafka::KafkaAdmin,
    machine::{cpu_times, field_kb, load_average, Machine},
    rabbitmq::RabbitAdmin,
    Broker, Options,
};

/// `application_name` of the harness's own connections (setup and progress polling).
pub(crate) const HARNESS_APPLICATION: &str = "outbox-bench";

/// Connections and settings shared by the scenarios of one run.
pub struct Bench {
    /// Command-line settings.
    pub options: Options,
    /// A small pool for setup, polling and the naive loop.
    pub pool: PgPool,
    /// NATS connection (core and JetStream), when a scenario of the run needs it.
    nats: Option<(async_nats::Client, jetstream::Context)>,
    /// Kafka admin connection, with `--broker kafka`.
    kafka: Option<KafkaAdmin>,
    /// RabbitMQ connection, with `--broker rabbitmq`.
    rabbitmq: Option<RabbitAdmin>,
    /// Unique id of this run: part of every schema, stream and subject name.
    pub run_id: String,
    started: Instant,
}

impl Bench {
    /// Connects to PostgreSQL, to NATS and Kafka where the run needs them, and picks a run id.
    pub async fn connect(
        options: Options,
        needs_nats: bool,
        needs_kafka: bool,
        needs_rabbitmq: bool,
    ) -> Result<Self> {
        // Named, so that the cost breakdown can tell the harness's own backends apart.
        let connect = PgConnectOptions::from_str(&options.database_url)
            .map_err(|e| format!("bad database URL: {e}"))?
            .application_name(HARNESS_APPLICATION);
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(connect)
            .await
            .map_err(|e| format!("cannot connect to PostgreSQL: {e}"))?;
        let nats = if needs_nats {
            let nats = async_nats::ConnectOptions::new()
                .name("outbox-bench")
                .connect(&options.nats_url)
                .await
                .map_err(|e| format!("cannot connect to NATS at {}: {e}", options.nats_url))?;
            let js = jetstream::new(nats.clone());
            Some((nats, js))
        } else {
            None
        };
        let kafka = if needs_kafka {
            Some(KafkaAdmin::connect(&options.kafka_brokers).await?)
        } else {
            None
        };
        let rabbitmq = if needs_rabbitmq {
            Some(RabbitAdmin::connect(&options.rabbitmq_url).await?)
        } else {
            None
        };
        let now = chrono::Utc::now();
        let run_id = format!(
            "{}{:04x}",
            now.format("%m%d%H%M%S"),
            std::process::id() & 0xffff
        );
        std::fs::create_dir_all(&options.out)
            .map_err(|e| format!("cannot create {}: {e}", options.out.display()))?;
        Ok(Self {
            options,
            pool,
            nats,
            kafka,
            rabbitmq,
            run_id,
            started: Instant::now(),
        })
    }

    /// The NATS connection.
    pub fn nats(&self) -> Result<&async_nats::Client> {
        Ok(&self.nats.as_ref().ok_or("this scenario needs NATS")?.0)
    }

    /// The JetStream context.
    pub fn js(&self) -> Result<&jetstream::Context> {
        Ok(&self.nats.as_ref().ok_or("this scenario needs NATS")?.1)
    }

    /// The Kafka admin connection.
    pub fn kafka(&self) -> Result<&KafkaAdmin> {
        Ok(self.kafka.as_ref().ok_or("this scenario needs Kafka")?)
    }

    /// The RabbitMQ connection.
    pub fn rabbitmq(&self) -> Result<&RabbitAdmin> {
        Ok(self
            .rabbitmq
            .as_ref()
            .ok_or("this scenario needs RabbitMQ")?)
    }

    /// The broker URL the relay of `scope` is started with.
    pub fn relay_broker_url(&self, scope: &Scope) -> String {
        match self.broker_of(scope) {
            Broker::Nats => self.options.nats_url.clone(),
            Broker::Kafka => format!("kafka://{}", self.options.kafka_brokers),
            Broker::Rabbitmq => self.options.rabbitmq_url.clone(),
        }
    }

    /// The broker the scenario publishes to: `--broker` for (a) drain and (n) consumer, NATS
    /// otherwise.
    pub fn broker_of(&self, scope: &Scope) -> Broker {
        if scope.scenario == "drain" || scope.scenario == "consumer" {
            self.options.broker
        } else {
            Broker::Nats
        }
    }

    /// Prints a progress line on stderr, stamped with the time since the run started.
    pub fn log(&self, scenario: &str, message: impl AsRef<str>) {
        eprintln!(
            "[{:7.1}s] {scenario}: {}",
            self.started.elapsed().as_secs_f64(),
            message.as_ref()
        );
    }

    /// Directory of results, logs and generated configs.
    pub fn out_dir(&self) -> &Path {
        &self.options.out
    }

    /// The relay binary: `--relay-bin`, else `outbox` next to this executable.
    pub fn relay_bin(&self) -> Result<PathBuf> {
        if let Some(path) = &self.options.relay_bin {
            return Ok(path.clone());
        }
        let exe = std::env::current_exe()?;
        let path = exe.with_file_name("outbox");
        if !path.exists() {
            return Err(format!(
                "relay binary {} not found: build it (cargo build --release -p outbox-cli) or \
                 pass --relay-bin",
                path.display()
            )
            .into());
        }
        Ok(path)
    }

    /// This process's command line, for the report.
    pub fn command_line(&self) -> String {
        let args: Vec<String> = std::env::args().skip(1).collect();
        format!("outbox-bench {}", args.join(" "))
    }

    /// Names for `scenario` in this run (nothing is created).
    pub fn scope(&self, scenario: &'static str) -> Result<Scope> {
        Ok(Scope {
            scenario,
            tables: Tables::new(&format!("bench_{scenario}_{}", self.run_id), "events")?,
            stream: format!("BENCH_{}_{}", self.run_id, scenario.to_uppercase()),
            subjects: format!("bench.{}.{scenario}", self.run_id),
            topic: format!("bench.{}.{scenario}.order.OrderPlaced", self.run_id),
            cdc: false,
        })
    }

    /// Creates the scenario's outbox schema (dropping a leftover one first).
    pub async fn create_outbox(&self, scope: &Scope) -> Result<()> {
        self.drop_outbox(scope).await?;
        PgOutbox::new(scope.tables.clone())
            .migrate(&self.pool, MigrateOptions::default())
            .await?;
        Ok(())
    }

    /// Drops the scenario's outbox schema.
    pub async fn drop_outbox(&self, scope: &Scope) -> Result<()> {
        sqlx::raw_sql(
            &scope
                .tables
                .render("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Inserts `n` pending events over `aggregates` aggregates with ~200-byte JSON payloads,
    /// in chunks of `INSERT … SELECT … generate_series`, then analyzes the table (unless
    /// `--skip-analyze`), so the planner knows the backlog as autovacuum would have seen it.
    pub async fn insert_backlog(&self, scope: &Scope, n: u64) -> Result<Duration> {
        const CHUNK: u64 = 100_000;
        let sql = format!(
            "INSERT INTO {} (event_id, aggregate_type, aggregate_id, event_type, payload)
             SELECT gen_random_uuid(), 'order', 'agg-' || (g % $3), 'OrderPlaced',
                    convert_to({}, 'UTF8')
             FROM generate_series($1::bigint, $2::bigint) AS g",
            scope.events_table(),
            PAYLOAD_SQL
        );
        let started = Instant::now();
        let mut from = 0;
        while from < n {
            let to = (from + CHUNK).min(n);
            sqlx::query(&sql)
                .bind(from as i64)
                .bind(to as i64 - 1)
                .bind(self.options.aggregates.max(1) as i64)
                .execute(&self.pool)
                .await?;
            from = to;
            if from % 500_000 == 0 && from < n {
                self.log(scope.scenario, format!("inserted {from} events"));
            }
        }
        if !self.options.skip_analyze {
            sqlx::raw_sql(&format!("ANALYZE {}", scope.events_table()))
                .execute(&self.pool)
                .await?;
        }
        Ok(started.elapsed())
    }

    /// Events waiting to be published.
    pub async fn pending(&self, scope: &Scope) -> Result<i64> {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE status = 'pending'",
            scope.events_table()
        );
        Ok(sqlx::query_scalar(&sql).fetch_one(&self.pool).await?)
    }

    /// Whether any event is pending (a cheap probe, unlike the count).
    pub async fn any_pending(&self, scope: &Scope) -> Result<bool> {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE status = 'pending')",
            scope.events_table()
        );
        Ok(sqlx::query_scalar(&sql).fetch_one(&self.pool).await?)
    }

    /// Average payload size of the scenario's events, in bytes.
    pub async fn average_payload(&self, scope: &Scope) -> Result<f64> {
        let sql = format!(
            "SELECT coalesce(avg(octet_length(payload)), 0)::float8 FROM {}",
            scope.events_table()
        );
        Ok(sqlx::query_scalar(&sql).fetch_one(&self.pool).await?)
    }

    /// Index entries read by scans of the scenario's events table, per index with any reads:
    /// (index, scans, entries read). Shows which index the claims really used.
    pub async fn index_reads(&self, scope: &Scope) -> Result<Vec<(String, i64, i64)>> {
        // Statistics of backends that just exited reach the shared counters shortly after.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let _ = sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(&self.pool)
            .await;
        Ok(sqlx::query_as(
            "SELECT indexrelname::text, idx_scan, idx_tup_read FROM pg_stat_user_indexes
             WHERE schemaname = $1 AND relname = $2 AND idx_tup_read > 0
             ORDER BY idx_tup_read DESC",
        )
        .bind(scope.tables.schema().as_str())
        .bind(scope.tables.events().as_str())
        .fetch_all(&self.pool)
        .await?)
    }

    /// How many times the events table was analyzed (by anyone) since it was created.
    pub async fn analyze_count(&self, scope: &Scope) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(max(analyze_count + autoanalyze_count), 0)::bigint
             FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
        )
        .bind(scope.tables.schema().as_str())
        .bind(scope.tables.events().as_str())
        .fetch_one(&self.pool)
        .await?)
    }

    /// Creates where the scenario's relay publishes: its stream, or with `--broker kafka` its
    /// topic (`--kafka-partitions` partitions).
    pub async fn create_destination(&self, scope: &Scope) -> Result<()> {
        match self.broker_of(scope) {
            Broker::Nats => self.create_stream(scope).await,
            Broker::Kafka => {
                self.kafka()?
                    .create_topic(&scope.topic, self.options.kafka_partitions)
                    .await
            }
            Broker::Rabbitmq => self.rabbitmq()?.create(&scope.stream).await,
        }
    }

    /// Creates the scenario's stream, capturing `<subjects>.>` (deleting a leftover one first).
    /// Its settings are those the relay would create (file storage, 2-minute dedupe window).
    pub async fn create_stream(&self, scope: &Scope) -> Result<()> {
        let js = self.js()?;
        let _ = js.delete_stream(&scope.stream).await;
        js.create_stream(stream::Config {
            name: scope.stream.clone(),
            subjects: vec![format!("{}.>", scope.subjects)],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("cannot create stream {}: {e}", scope.stream))?;
        Ok(())
    }

    /// Messages held by the scenario's stream (or Kafka topic).
    pub async fn stream_messages(&self, scope: &Scope) -> Result<u64> {
        match self.broker_of(scope) {
            Broker::Nats => {
                let mut stream = self.js()?.get_stream(&scope.stream).await?;
                Ok(stream.info().await?.state.messages)
            }
            Broker::Kafka => {
                self.kafka()?
                    .messages(&scope.topic, self.options.events)
                    .await
            }
            Broker::Rabbitmq => self.rabbitmq()?.messages(&scope.stream).await,
        }
    }

    /// Deletes the scenario's stream (or Kafka topic) and drops its schema; failures are only
    /// reported.
    pub async fn cleanup(&self, scope: &Scope) {
        let deleted = match self.broker_of(scope) {
            Broker::Nats => match self.js() {
                Ok(js) => js
                    .delete_stream(&scope.stream)
                    .await
                    .map(drop)
                    .map_err(|e| format!("could not delete stream {}: {e}", scope.stream)),
                Err(e) => Err(e.to_string()),
            },
            Broker::Kafka => match self.kafka() {
                Ok(kafka) => kafka
                    .delete_topic(&scope.topic)
                    .await
                    .map_err(|e| format!("could not delete topic {}: {e}", scope.topic)),
                Err(e) => Err(e.to_string()),
            },
            Broker::Rabbitmq => match self.rabbitmq() {
                Ok(rabbitmq) => {
                    rabbitmq.delete(&scope.stream).await;
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            },
        };
        if let Err(e) = deleted {
            self.log(scope.scenario, e);
        }
        self.cleanup_schema(scope).await;
    }

    /// Drops the scenario's schema; a failure is only reported.
    pub async fn cleanup_schema(&self, scope: &Scope) {
        if let Err(e) = self.drop_outbox(scope).await {
            self.log(
                scope.scenario,
                format!("could not drop schema {}: {e}", scope.tables.schema()),
            );
        }
    }

    /// Facts about this machine and its services, for the report.
    pub async fn machine(&self) -> Result<Machine> {
        let setting = |name: &'static str| {
            let pool = self.pool.clone();
            async move {
                sqlx::query_scalar::<_, String>(&format!("SHOW {name}"))
                    .fetch_one(&pool)
                    .await
            }
        };
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let memory_kb = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| field_kb(&t, "MemTotal:"))
            .unwrap_or(0);
        Ok(Machine {
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            memory_gib: memory_kb as f64 / 1024.0 / 1024.0,
            postgres: setting("server_version").await?,
            shared_buffers: setting("shared_buffers").await?,
            synchronous_commit: setting("synchronous_commit").await?,
            load_average: load_average(),
            autovacuum: setting("autovacuum").await?,
            brokers: self.brokers(),
        })
    }
}

impl Bench {
    /// The brokers of this run, for the report.
    fn brokers(&self) -> String {
        let mut brokers = Vec::new();
        if let Some((nats, _)) = &self.nats {
            brokers.push(format!(
                "NATS {} (JetStream, file storage)",
                nats.server_info().version
            ));
        }
        if let Some(kafka) = &self.kafka {
            brokers.push(format!(
                "{} for (a) drain, topic of {} partitions",
                kafka.description, self.options.kafka_partitions
            ));
        }
        if let Some(rabbitmq) = &self.rabbitmq {
            brokers.push(format!(
                "{}, a lazy durable queue bound with #",
                rabbitmq.description
            ));
        }
        brokers.join("; ")
    }
}

impl Bench {
    /// Before a measured phase: a checkpoint (its full-page writes then weigh on every phase
    /// alike; skipped without superuser rights), then a wait, up to 90 s, for the machine to be
    /// quiet (under 15% of its CPU busy over one second) once the previous phase's cleanup,
    /// vacuum and flushes are done. Logged, so a phase that started on a busy machine shows.
    pub async fn settle(&self, scenario: &str) {
        if let Err(e) = sqlx::query("CHECKPOINT").execute(&self.pool).await {
            self.log(scenario, format!("no CHECKPOINT before the phase: {e}"));
        }
        let started = Instant::now();
        let mut busy = 1.0;
        while started.elapsed() < Duration::from_secs(90) {
            let before = cpu_times();
            tokio::time::sleep(Duration::from_secs(1)).await;
            busy = match (before, cpu_times()) {
                (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => (b1 - b0) as f64 / (t1 - t0) as f64,
                _ => 0.0,
            };
            if busy < 0.15 {
                break;
            }
        }
        self.log(
            scenario,
            format!(
                "settled for {:.0}s: {:.0}% of the CPU busy at the start",
                started.elapsed().as_secs_f64(),
                busy * 100.0
            ),
        );
    }
}
