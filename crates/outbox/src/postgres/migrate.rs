//! Versioned migrations. Each file is a template rendered with the validated schema and table
//! names; all pending files run in one transaction under an advisory lock, so any number of
//! processes may call `migrate` at once.

use sqlx::Executor;

use crate::{
    error::{Error, SchemaError},
    ident::Tables,
    migration::{MigrateOptions, DEFAULT_PARTITIONS},
    sql::named,
};

const SQL: &str = include_str!("sql/migrate.sql");

/// The migrations this build ships: (version, description, template).
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "create outbox",
        include_str!("migrations/0001_create_outbox.sql"),
    ),
    (
        2,
        "create inbox",
        include_str!("migrations/0002_create_inbox.sql"),
    ),
    (
        3,
        "purge index and audit table",
        include_str!("migrations/0003_operations.sql"),
    ),
    (
        4,
        "archive table",
        include_str!("migrations/0004_archive.sql"),
    ),
    (
        5,
        "time partitioning setting",
        include_str!("migrations/0005_time_partitioning.sql"),
    ),
    (
        6,
        "pending rows by aggregate",
        include_str!("migrations/0006_pending_aggregate_index.sql"),
    ),
    (7, "sagas", include_str!("migrations/0007_sagas.sql")),
    (8, "cdc slots", include_str!("migrations/0008_cdc.sql")),
    (
        9,
        "zero-growth enqueue",
        include_str!("migrations/0009_zero_growth_enqueue.sql"),
    ),
    (
        10,
        "zero-growth enqueue plans: index scans, kept",
        include_str!("migrations/0010_zero_growth_index_only.sql"),
    ),
    (
        11,
        "permanent failures counted apart",
        include_str!("migrations/0011_permanent_failures.sql"),
    ),
    (
        12,
        "waiting rows out of the claim's index",
        include_str!("migrations/0012_waiting_rows.sql"),
    ),
    (
        13,
        "stream position of CDC holds",
        include_str!("migrations/0013_hold_stream_position.sql"),
    ),
    (
        14,
        "consumers' version gate",
        include_str!("migrations/0014_consumer_versions.sql"),
    ),
    (
        15,
        "inbox: text message ids and event types",
        include_str!("migrations/0015_inbox_message_ids.sql"),
    ),
    (
        16,
        "consumers' held events",
        include_str!("migrations/0016_consumer_held.sql"),
    ),
    (
        17,
        "arrival time by the database clock",
        include_str!("migrations/0017_enqueued_at.sql"),
    ),
    (
        18,
        "one version per aggregate: the same event is not another",
        include_str!("migrations/0018_unique_version_same_event.sql"),
    ),
];

/// Takes the schema's migration lock until the end of the transaction: one lock per schema
/// name, so that concurrent migrators (and CDC set-ups) queue, then find the work done.
pub(super) async fn lock(tx: &mut sqlx::PgConnection, tables: &Tables) -> Result<(), Error> {
    sqlx::query(named(SQL, "lock"))
        .bind(tables.schema().as_str())
        .execute(tx)
        .await
        .map_err(Error::Database)
        .map(drop)
}

/// The partition count a run creates the outbox with, checked.
fn partition_count(options: MigrateOptions) -> Result<i32, Error> {
    let partitions = options.partitions.unwrap_or(DEFAULT_PARTITIONS);
    if !(1..=4096).contains(&partitions) {
        return Err(Error::Schema(SchemaError::BadPartitionCount(partitions)));
    }
    Ok(partitions)
}

/// A migration template rendered for this outbox.
fn render(tables: &Tables, template: &str, partitions: i32) -> String {
    tables
        .render(template)
        .replace("{partitions}", &partitions.to_string())
}

pub(super) async fn run(
    pool: &sqlx::PgPool,
    tables: &Tables,
    options: MigrateOptions,
) -> Result<(), Error> {
    let partitions = partition_count(options)?;
    let mut tx = pool.begin().await.map_err(Error::Database)?;
    lock(&mut tx, tables).await?;
    (&mut *tx)
        .execute(sqlx::raw_sql(&tables.render(named(SQL, "bootstrap"))))
        .await
        .map_err(Error::Database)?;
    let applied: Vec<(i32, String)> = sqlx::query_as(&tables.render(named(SQL, "applied")))
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::Database)?;

    let creating = applied.is_empty();
    for (version, description, template) in crate::migration::due(&applied, MIGRATIONS)? {
        let checksum = crate::migration::checksum(template);
        (&mut *tx)
            .execute(sqlx::raw_sql(&render(tables, template, partitions)))
            .await
            .map_err(Error::Database)?;
        sqlx::query(&format!(
            "{} ($1, $2, $3)",
            tables.render(named(SQL, "record"))
        ))
        .bind(version)
        .bind(description)
        .bind(&checksum)
        .execute(&mut *tx)
        .await
        .map_err(Error::Database)?;
    }
    if let (true, Some(days)) = (creating, options.time_partition_days) {
        super::time_partitions::convert(&mut tx, tables, days).await?;
    }
    let (existing, days): (i32, Option<i32>) =
        sqlx::query_as(&tables.render(named(SQL, "settings")))
            .fetch_one(&mut *tx)
            .await
            .map_err(Error::Database)?;
    settings_match(existing, days, options)?;
    tx.commit().await.map_err(Error::Database)
}

/// Checks the settings asked for against those an existing outbox was created with
/// (`existing` partitions, time partitions `days` wide).
fn settings_match(existing: i32, days: Option<i32>, options: MigrateOptions) -> Result<(), Error> {
    if let Some(requested) = options.time_partition_days {
        if days != Some(requested) {
            return Err(Error::Schema(SchemaError::TimePartitioning(match days {
                Some(d) => {
                    format!("the outbox was created with {d}-day partitions, {requested} requested")
                }
                None => "the outbox exists as a plain table; time partitioning is chosen when \
                         it is created"
                    .into(),
            })));
        }
    }
    match options.partitions {
        Some(requested) if requested != existing => {
            Err(Error::Schema(SchemaError::PartitionMismatch {
                existing,
                requested,
            }))
        }
        _ => Ok(()),
    }
}

/// The migrations [`run`] would apply, as one script that runs them in one transaction (it
/// holds its `BEGIN` and `COMMIT`: `psql -v ON_ERROR_STOP=1 -f …`), under the same advisory
/// lock, so that it queues behind (and ahead of) `outbox migrate` runs. With a pool, only what the database
/// lacks, read without writing anything; without one, every migration, for a new outbox.
pub(super) async fn script(
    pool: Option<&sqlx::PgPool>,
    tables: &Tables,
    options: MigrateOptions,
) -> Result<String, Error> {
    let partitions = partition_count(options)?;
    let applied = match pool {
        Some(pool) => applied(pool, tables).await?,
        None => Vec::new(),
    };
    let due = crate::migration::due(&applied, MIGRATIONS)?;
    match (applied.is_empty(), pool) {
        (true, _) if options.time_partition_days.is_some() => {
            return Err(Error::Schema(SchemaError::TimePartitioning(
                "a printed script cannot convert a new outbox to time partitions (the \
                 conversion reads the indexes the migrations create): create it with \
                 `outbox migrate --time-partition-days N`, or print it without"
                    .into(),
            )))
        }
        (false, Some(pool)) => check_settings(pool, tables, options).await?,
        _ => {}
    }
    let outbox = tables.render("{schema}.{events}");
    let mut script = crate::migration_script::Script::new("PostgreSQL", &outbox);
    if due.is_empty() {
        return Ok(script.finish());
    }
    script.comment("One transaction, stopping at the first error: psql -v ON_ERROR_STOP=1 -f FILE");
    script.statement("BEGIN");
    script.comment("The lock `outbox migrate` takes: concurrent migrators queue.");
    script.statement(&named(SQL, "lock").replace(
        "$1",
        &crate::migration_script::literal(tables.schema().as_str()),
    ));
    script.statement(&tables.render(named(SQL, "bootstrap")));
    for (version, description, template) in due {
        script.migration(*version, description);
        script.statement(&render(tables, template, partitions));
        script.statement(&format!(
            "{} ({version}, {}, {})",
            tables.render(named(SQL, "record")),
            crate::migration_script::literal(description),
            crate::migration_script::literal(&crate::migration::checksum(template))
        ));
    }
    script.statement("COMMIT");
    Ok(script.finish())
}

/// The migrations the database records (version, checksum); none when the outbox's schema or
/// its bookkeeping table does not exist. Reads only.
async fn applied(pool: &sqlx::PgPool, tables: &Tables) -> Result<Vec<(i32, String)>, Error> {
    let exists: bool = sqlx::query_scalar(named(SQL, "has_bookkeeping"))
        .bind(tables.render("{schema}.migrations"))
        .fetch_one(pool)
        .await
        .map_err(Error::Database)?;
    if !exists {
        return Ok(Vec::new());
    }
    sqlx::query_as(&tables.render(named(SQL, "applied")))
        .fetch_all(pool)
        .await
        .map_err(Error::Database)
}

/// Checks the settings asked for against those an existing outbox was created with.
async fn check_settings(
    pool: &sqlx::PgPool,
    tables: &Tables,
    options: MigrateOptions,
) -> Result<(), Error> {
    let (existing, days): (i32, Option<i32>) =
        sqlx::query_as(&tables.render(named(SQL, "settings")))
            .fetch_one(pool)
            .await
            .map_err(Error::Database)?;
    settings_match(existing, days, options)
}
