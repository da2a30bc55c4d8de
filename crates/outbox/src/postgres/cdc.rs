//! Change data capture set-up: the publication on the events table and the logical replication
//! slot the CDC relay (`outbox relay --mode cdc`) streams from. Idempotent and safe from
//! several processes at once, like the migrations; `outbox migrate --cdc` calls [`setup`].
//!
//! A slot retains WAL until the relay confirms it: a slot nobody reads fills the disk. Drop
//! what you no longer use with [`drop`] (`outbox migrate --drop-cdc`).

use sqlx::{Executor, PgPool};

use crate::{
    error::{Error, SchemaError},
    ident::{Ident, Tables},
};

/// The publication and slot of one CDC relay group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CdcNames {
    /// Replication slot name (validated identifier; cluster-wide).
    pub slot: Ident,
    /// Publication name (validated identifier; per database).
    pub publication: Ident,
}

impl CdcNames {
    /// Validates both names.
    pub fn new(slot: &str, publication: &str) -> Result<Self, Error> {
        Ok(Self {
            slot: Ident::new("cdc.slot", slot)?,
            publication: Ident::new("cdc.publication", publication)?,
        })
    }

    /// The defaults for an outbox: slot and publication both named `{schema}_{table}` (cut to
    /// 63 bytes), so that outboxes in other schemas of the cluster do not collide.
    pub fn for_tables(tables: &Tables) -> Self {
        let mut name = format!("{}_{}", tables.schema().as_str(), tables.events().as_str());
        name.truncate(63);
        Self::new(&name, &name).expect("made of two identifiers")
    }

    /// The names of an outbox's CDC set-up when they are not all given: a given slot (with the
    /// given publication, or the default); else the set-up recorded in this database's
    /// `{schema}.cdc_slots` (`recorded`: slot and publication, by `outbox migrate --cdc`),
    /// when there is one, or the default's among several; else the defaults
    /// ([`CdcNames::for_tables`]), with the slot made this database's own (`database`
    /// given: the default slot belongs to another database of the cluster, as when two
    /// services' outboxes share one PostgreSQL).
    pub fn choose(
        tables: &Tables,
        slot: Option<&str>,
        publication: Option<&str>,
        recorded: &[(String, String)],
        database: Option<&str>,
    ) -> Result<Self, Error> {
        let defaults = Self::for_tables(tables);
        let publication_or = |other: &str| publication.unwrap_or(other).to_owned();
        if let Some(slot) = slot {
            return Self::new(slot, &publication_or(defaults.publication.as_str()));
        }
        let default_slot = defaults.slot.as_str();
        let chosen = match recorded {
            [(slot, recorded_publication)] => Some((slot, recorded_publication)),
            [] => None,
            several => Some(
                several
                    .iter()
                    .find(|(slot, _)| slot == default_slot)
                    .map(|(slot, p)| (slot, p))
                    .ok_or_else(|| {
                        let slots: Vec<&str> = several.iter().map(|(s, _)| s.as_str()).collect();
                        cdc_error(format!(
                            "this outbox has several CDC slots set up ({}): name the one to \
                             use (--slot NAME, `[relay.cdc] slot = \"NAME\"`)",
                            slots.join(", ")
                        ))
                    })?,
            ),
        };
        if let Some((slot, recorded_publication)) = chosen {
            return Self::new(slot, &publication_or(recorded_publication));
        }
        let slot = match database {
            Some(database) => per_database(default_slot, database),
            None => default_slot.to_owned(),
        };
        Self::new(&slot, &publication_or(defaults.publication.as_str()))
    }

    /// The names `outbox migrate --cdc` (and `--drop-cdc`) use for this outbox when
    /// `slot` or `publication` is not given: see [`CdcNames::choose`]. The default slot is
    /// made this database's own when a slot of that name belongs to another database.
    pub async fn resolve(
        pool: &PgPool,
        tables: &Tables,
        slot: Option<&str>,
        publication: Option<&str>,
    ) -> Result<Self, Error> {
        if slot.is_some() {
            return Self::choose(tables, slot, publication, &[], None);
        }
        let recorded = recorded(pool, tables).await?;
        let default_slot = Self::for_tables(tables).slot;
        let elsewhere: Option<String> = sqlx::query_scalar(
            "SELECT current_database()::text FROM pg_replication_slots
             WHERE slot_name = $1 AND database IS DISTINCT FROM current_database()",
        )
        .bind(default_slot.as_str())
        .fetch_optional(pool)
        .await
        .map_err(Error::Database)?;
        Self::choose(tables, None, publication, &recorded, elsewhere.as_deref())
    }
}

/// The CDC set-ups recorded for this outbox (slot, publication), oldest first; none when the
/// outbox has no CDC record table yet.
pub async fn recorded(pool: &PgPool, tables: &Tables) -> Result<Vec<(String, String)>, Error> {
    let sql =
        tables.render("SELECT slot, publication FROM {schema}.cdc_slots ORDER BY created_at, slot");
    match sqlx::query_as(&sql).fetch_all(pool).await {
        Ok(rows) => Ok(rows),
        Err(e) if code(&e).as_deref() == Some("42P01") => Ok(Vec::new()),
        Err(e) => Err(Error::Database(e)),
    }
}

/// `slot` made unique to `database`: a suffix of 8 hex digits of the database name's FNV-1a
/// hash (stable across versions and machines), the name cut to fit 63 bytes.
fn per_database(slot: &str, database: &str) -> String {
    let hash = crate::migration::checksum(database);
    let mut name = slot.to_owned();
    name.truncate(63 - 9);
    format!("{name}_{}", &hash[..8])
}

/// A slot as `setup` finds it: WAL status, the process streaming it, its database, and the
/// database of this connection.
type SlotRow = (Option<String>, Option<i32>, Option<String>, String);

/// What [`setup`] found or created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CdcSetup {
    /// Whether the publication was created now.
    pub created_publication: bool,
    /// Whether the slot was created now (also after a lost slot was recreated).
    pub created_slot: bool,
    /// Highest event id that may predate the slot: the relay publishes pending rows up to it
    /// from the table before it streams. `None` when there is nothing to catch up.
    pub catch_up_max_id: Option<i64>,
}

fn cdc_error(why: impl Into<String>) -> Error {
    Error::Schema(SchemaError::Cdc(why.into()))
}

/// Checks that the server can decode logical changes (`wal_level = logical`).
pub async fn check_wal_level(pool: &PgPool) -> Result<(), Error> {
    let level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
        .fetch_one(pool)
        .await
        .map_err(Error::Database)?;
    if level != "logical" {
        return Err(cdc_error(format!(
            "wal_level is '{level}', and logical replication needs 'logical': run \
             ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"
        )));
    }
    Ok(())
}

/// Creates the publication (inserts and deletes of the events table) and the slot (pgoutput)
/// if they do not exist, and records the slot in `{schema}.cdc_slots`. A slot invalidated by
/// `max_slot_wal_keep_size` (`wal_status` `lost`) is dropped and made anew; an error if a
/// process still holds it. The outbox must be migrated first.
pub async fn setup(pool: &PgPool, tables: &Tables, names: &CdcNames) -> Result<CdcSetup, Error> {
    check_wal_level(pool).await?;
    let created_publication = {
        let mut tx = pool.begin().await.map_err(Error::Database)?;
        super::migrate::lock(&mut tx, tables).await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)")
                .bind(names.publication.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(Error::Database)?;
        if !exists {
            // Deletes are published so that the relay knows a zero-growth row is gone; it
            // never publishes them. The root's name for a time-partitioned table.
            let sql = tables.render(&format!(
                "CREATE PUBLICATION {} FOR TABLE {{schema}}.{{events}} \
                 WITH (publish = 'insert, delete', publish_via_partition_root = true)",
                names.publication
            ));
            (&mut *tx)
                .execute(sqlx::raw_sql(&sql))
                .await
                .map_err(map_missing)?;
        }
        tx.commit().await.map_err(Error::Database)?;
        !exists
    };
    // A slot cannot be created in a transaction that wrote: its own connection, autocommit.
    let mut conn = pool.acquire().await.map_err(Error::Database)?;
    let found: Option<SlotRow> = sqlx::query_as(
        "SELECT wal_status, active_pid, database::text, current_database()::text
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(names.slot.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::Database)?;
    // Slots are cluster-wide: one of this name made for an outbox in another database streams
    // that database's changes, and is never adopted.
    if let Some((_, _, database, here)) = &found {
        if database.as_deref() != Some(here.as_str()) {
            let other = database.as_deref().unwrap_or("(none: a physical slot)");
            return Err(cdc_error(format!(
                "replication slot {} already exists and belongs to database {other}, and \
                 this outbox is in database {here}: give this outbox a slot of its own \
                 (--slot NAME, then `[relay.cdc] slot = \"NAME\"` for its relays)",
                names.slot.as_str()
            )));
        }
    }
    let found = found.map(|(status, active, _, _)| (status, active));
    let mut exists = found.is_some();
    // A slot invalidated by `max_slot_wal_keep_size` is still listed but can never stream
    // again: it is dropped and made anew (the rows it missed are caught up from the table).
    if let Some((Some(status), active)) = &found {
        if status == "lost" {
            if let Some(pid) = active {
                return Err(cdc_error(format!(
                    "replication slot {} is lost (its WAL was removed) and still in use by \
                     process {pid}: stop the CDC relays, then run this again",
                    names.slot.as_str()
                )));
            }
            sqlx::query("SELECT pg_drop_replication_slot($1)")
                .bind(names.slot.as_str())
                .execute(&mut *conn)
                .await
                .map_err(Error::Database)?;
            exists = false;
        }
    }
    let mut created_slot = false;
    if !exists {
        let created = sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
            .bind(names.slot.as_str())
            .execute(&mut *conn)
            .await;
        match created {
            Ok(_) => created_slot = true,
            // Another process created it between the check and here.
            Err(e) if code(&e).as_deref() == Some("42710") => {}
            Err(e) if code(&e).as_deref() == Some("42501") => {
                return Err(cdc_error(format!(
                    "creating replication slot {}: the database user needs the REPLICATION \
                     attribute (ALTER ROLE … REPLICATION)",
                    names.slot.as_str()
                )))
            }
            Err(e) => return Err(Error::Database(e)),
        }
    }
    // After the slot exists: every row committed before it is visible now, so the highest id
    // seen bounds the rows the stream may not carry. A slot found without its record (created
    // by hand, or before this outbox knew) is treated the same way: catching up only risks
    // duplicates, never loss.
    let record = tables.render(
        "INSERT INTO {schema}.cdc_slots (slot, publication, catch_up_max_id)
         SELECT $1, $2, (SELECT max(id) FROM {schema}.{events} WHERE status = 'pending')
         ON CONFLICT (slot) DO UPDATE
             SET publication = EXCLUDED.publication,
                 catch_up_max_id = CASE WHEN $3 THEN EXCLUDED.catch_up_max_id
                                        ELSE {schema}.cdc_slots.catch_up_max_id END
         RETURNING catch_up_max_id",
    );
    let catch_up_max_id: Option<i64> = sqlx::query_scalar(&record)
        .bind(names.slot.as_str())
        .bind(names.publication.as_str())
        .bind(created_slot)
        .fetch_one(&mut *conn)
        .await
        .map_err(map_missing)?;
    Ok(CdcSetup {
        created_publication,
        created_slot,
        catch_up_max_id,
    })
}

/// Drops the slot (it must not be in use: stop the CDC relays first), the publication and the
/// record. Missing pieces are skipped. A slot of that name that belongs to another database of
/// the cluster is refused, and nothing is dropped: it is another outbox's.
pub async fn drop(pool: &PgPool, tables: &Tables, names: &CdcNames) -> Result<(), Error> {
    let found: Option<(Option<i32>, Option<String>, String)> = sqlx::query_as(
        "SELECT active_pid, database::text, current_database()::text
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(names.slot.as_str())
    .fetch_optional(pool)
    .await
    .map_err(Error::Database)?;
    if let Some((_, database, here)) = &found {
        if database.as_deref() != Some(here.as_str()) {
            let other = database.as_deref().unwrap_or("(none: a physical slot)");
            return Err(cdc_error(format!(
                "replication slot {} belongs to database {other}, and this outbox is in \
                 database {here}: not dropped (drop it from that database)",
                names.slot.as_str()
            )));
        }
    }
    match found.map(|(active, _, _)| active) {
        Some(Some(pid)) => {
            return Err(cdc_error(format!(
                "replication slot {} is in use by process {pid}: stop the CDC relays first",
                names.slot.as_str()
            )))
        }
        Some(None) => {
            sqlx::query("SELECT pg_drop_replication_slot($1)")
                .bind(names.slot.as_str())
                .execute(pool)
                .await
                .map_err(Error::Database)?;
        }
        None => {}
    }
    let sql = format!("DROP PUBLICATION IF EXISTS {}", names.publication);
    pool.execute(sqlx::raw_sql(&sql))
        .await
        .map_err(Error::Database)?;
    sqlx::query(&tables.render("DELETE FROM {schema}.cdc_slots WHERE slot = $1"))
        .bind(names.slot.as_str())
        .execute(pool)
        .await
        .map_err(map_missing)?;
    Ok(())
}

fn code(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

fn map_missing(e: sqlx::Error) -> Error {
    match code(&e).as_deref() {
        Some("42P01" | "3F000") => Error::Schema(SchemaError::Missing),
        _ => Error::Database(e),
    }
}

/// A CDC slot of the outbox as `outbox status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SlotStatus {
    /// Slot name.
    pub slot: String,
    /// Publication name.
    pub publication: String,
    /// Whether the slot exists on the server (a lost slot is still recorded).
    pub exists: bool,
    /// The walsender streaming it, if any.
    pub active_pid: Option<i32>,
    /// WAL written since the slot's confirmed position, bytes.
    pub lag_bytes: Option<i64>,
    /// WAL the slot retains, bytes.
    pub retained_bytes: Option<i64>,
    /// `reserved`, `extended`, `unreserved` or `lost` (PostgreSQL's `wal_status`).
    pub wal_status: Option<String>,
    /// Catch-up still to do: pending rows up to this id are published from the table first.
    pub catch_up_max_id: Option<i64>,
}

/// The outbox's recorded CDC slots with their server state; empty before migration 8.
pub async fn slots(pool: &PgPool, tables: &Tables) -> Result<Vec<SlotStatus>, Error> {
    let sql = tables.render(
        "SELECT c.slot, c.publication, s.slot_name IS NOT NULL AS exists, s.active_pid,
                (pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint AS lag_bytes,
                (pg_current_wal_lsn() - s.restart_lsn)::bigint AS retained_bytes,
                s.wal_status, c.catch_up_max_id
         FROM {schema}.cdc_slots c
         LEFT JOIN pg_replication_slots s ON s.slot_name = c.slot
         ORDER BY c.slot",
    );
    let rows = match sqlx::query_as::<
        _,
        (
            String,
            String,
            bool,
            Option<i32>,
            Option<i64>,
            Option<i64>,
            Option<String>,
            Option<i64>,
        ),
    >(&sql)
    .fetch_all(pool)
    .await
    {
        Ok(rows) => rows,
        Err(e) if code(&e).as_deref() == Some("42P01") => return Ok(Vec::new()),
        Err(e) => return Err(map_missing(e)),
    };
    Ok(rows
        .into_iter()
        .map(|r| SlotStatus {
            slot: r.0,
            publication: r.1,
            exists: r.2,
            active_pid: r.3,
            lag_bytes: r.4,
            retained_bytes: r.5,
            wal_status: r.6,
            catch_up_max_id: r.7,
        })
        .collect())
}
