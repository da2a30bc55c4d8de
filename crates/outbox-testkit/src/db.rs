use outbox::{
    postgres::{MigrateOptions, PgOutbox},
    Event, Outbox, Tables,
};
use sqlx::{postgres::PgPoolOptions, PgPool};

/// The shared test database (`OUTBOX_TEST_DATABASE_URL`, default the local `test` database).
pub fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The PostgreSQL with `wal_level = logical` for the CDC tests (`OUTBOX_CDC_DATABASE_URL`,
/// default the private server `scripts/tools/pg_cdc.sh` starts on port 5433).
pub fn cdc_database_url() -> String {
    std::env::var("OUTBOX_CDC_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5433/postgres".into())
}

/// A freshly migrated outbox in a schema of its own, dropped when the value is dropped.
pub struct TestDb {
    /// Pool on the test database.
    pub pool: PgPool,
    /// Where the outbox lives.
    pub tables: Tables,
    /// The schema name.
    pub schema: String,
    /// The server it lives on.
    pub url: String,
}

impl TestDb {
    /// Creates and migrates a new schema with `partitions` partitions.
    pub async fn new(partitions: i32) -> Self {
        Self::with_options(MigrateOptions {
            partitions: Some(partitions),
            ..Default::default()
        })
        .await
    }

    /// Creates and migrates a new schema with these options.
    pub async fn with_options(options: MigrateOptions) -> Self {
        Self::on(&database_url(), options).await
    }

    /// Creates and migrates a new schema on the server at `url`.
    pub async fn on(url: &str, options: MigrateOptions) -> Self {
        let schema = crate::unique("t");
        let pool = PgPoolOptions::new()
            .max_connections(20)
            // Tests abort tasks (a killed consumer, relay or writer) in their transactions.
            .after_release(|conn, _| Box::pin(outbox::postgres::outside_transaction(conn)))
            .connect(url)
            .await
            .expect("connect to the test database");
        let tables = Tables::new(&schema, "events").expect("valid names");
        PgOutbox::new(tables.clone())
            .migrate(&pool, options)
            .await
            .expect("migrate");
        Self {
            pool,
            tables,
            schema,
            url: url.to_owned(),
        }
    }

    /// A second handle on an existing test outbox (for tasks); it does not drop the schema.
    pub fn adopt(pool: PgPool, tables: Tables) -> Self {
        Self {
            pool,
            tables,
            schema: String::new(),
            url: database_url(),
        }
    }

    /// The writer for this outbox.
    pub fn outbox(&self) -> PgOutbox {
        PgOutbox::new(self.tables.clone())
    }

    /// Count of rows with `status`.
    pub async fn count(&self, status: &str) -> i64 {
        sqlx::query_scalar(
            &self
                .tables
                .render("SELECT count(*) FROM {schema}.{events} WHERE status = $1"),
        )
        .bind(status)
        .fetch_one(&self.pool)
        .await
        .expect("count")
    }

    /// Runs `sql` with `{schema}`/`{events}` rendered.
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(&self.tables.render(sql))
            .execute(&self.pool)
            .await
            .expect("exec");
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.schema.is_empty() {
            return;
        }
        let schema = self.schema.clone();
        let url = self.url.clone();
        // Drop runs outside async context guarantees: use a thread with its own runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok(pool) = PgPool::connect(&url).await {
                    // A CDC test's slot and publication are named after its schema: without
                    // the drop they would retain WAL for ever.
                    let _ = sqlx::raw_sql(&format!(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                         WHERE slot_name LIKE '{schema}%' AND NOT active; \
                         DROP PUBLICATION IF EXISTS \"{schema}_events\";"
                    ))
                    .execute(&pool)
                    .await;
                    let _ = sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                        .execute(&pool)
                        .await;
                }
            });
        })
        .join();
    }
}

/// Writes `per_aggregate` events for each of `aggregates` aggregates (ids `a0`, `a1`, …), with
/// aggregate versions 1..=per_aggregate, in transactions of `chunk` events interleaving the
/// aggregates. Returns the number written.
pub async fn insert_sequences(
    db: &TestDb,
    aggregate_type: &str,
    aggregates: usize,
    per_aggregate: i64,
    chunk: usize,
) -> usize {
    let outbox = db.outbox();
    let mut events = Vec::new();
    for version in 1..=per_aggregate {
        for a in 0..aggregates {
            events.push(
                Event::new(aggregate_type, format!("a{a}"), "Happened")
                    .json(&serde_json::json!({ "a": a, "v": version }))
                    .expect("json")
                    .aggregate_version(version),
            );
        }
    }
    for part in events.chunks(chunk) {
        let mut tx = db.pool.begin().await.expect("begin");
        outbox.enqueue_batch(&mut tx, part).await.expect("enqueue");
        tx.commit().await.expect("commit");
    }
    events.len()
}
