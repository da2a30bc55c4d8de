//! Two outboxes in two databases of one PostgreSQL cluster. Given the same slot name, the
//! second neither adopts the first's slot (`migrate --cdc`) nor streams from it (the relay),
//! and both say which databases are involved. By default, the second gets a slot of its own,
//! which its relay finds.

mod common;

use outbox::Outbox;
use std::time::Duration;

use common::cdc::{cdc_config, outbox_on, start, write, WAIT};
use outbox::postgres::{
    cdc::{self, CdcNames},
    MigrateOptions, PgOutbox, WriteMode,
};
use outbox_testkit::{cdc_database_url, unique, wait_until, NatsReader, TestDb, NATS_URL};
use sqlx::{Connection, PgConnection, PgPool};

/// A database of its own on the CDC server, dropped at the end of the test.
struct OtherDatabase {
    name: String,
    url: String,
}

impl OtherDatabase {
    async fn create() -> Self {
        let name = unique("slotdb");
        let mut admin = PgConnection::connect(&cdc_database_url()).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .unwrap();
        let base = cdc_database_url();
        let at = base.rfind('/').expect("a database in the URL");
        let url = format!("{}/{name}", &base[..at]);
        Self { name, url }
    }
}

impl Drop for OtherDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs outside async context guarantees: a thread with its own runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut admin = PgConnection::connect(&cdc_database_url()).await.unwrap();
                let _ = sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await;
            });
        })
        .join();
    }
}

/// Waits for `relay` to stop by itself, with an error that names database `other`.
async fn stops_naming(relay: outbox_relayer::RelayHandle, other: &str) {
    wait_until("the relay to stop", Duration::from_secs(30), || async {
        relay.is_finished()
    })
    .await;
    let error = relay
        .shutdown()
        .await
        .expect_err("it stopped with an error");
    assert!(
        error
            .to_string()
            .contains(&format!("belongs to database {other}")),
        "{error}"
    );
}

#[tokio::test]
async fn a_slot_of_another_database_is_neither_adopted_nor_streamed() {
    let first = outbox_on(&cdc_database_url(), 1).await;
    // The first outbox's own names: its schema's drop drops its slot, whatever happens.
    let names = CdcNames::for_tables(&first.tables);
    cdc::setup(&first.pool, &first.tables, &names)
        .await
        .unwrap();
    let first_db: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(&first.pool)
        .await
        .unwrap();

    let other = OtherDatabase::create().await;
    let second: TestDb = outbox_on(&other.url, 1).await;
    let refused = cdc::setup(&second.pool, &second.tables, &names)
        .await
        .expect_err("the second outbox adopted the first's slot");
    let message = refused.to_string();
    assert!(
        message.contains(&format!("belongs to database {first_db}"))
            && message.contains(&format!("outbox is in database {}", other.name)),
        "{message}"
    );
    // Nor does it drop it (`migrate --drop-cdc --slot …` from the wrong database once dropped
    // the other outbox's slot, losing what it had not streamed yet).
    let refused = cdc::drop(&second.pool, &second.tables, &names)
        .await
        .expect_err("the second outbox dropped the first's slot")
        .to_string();
    assert!(
        refused.contains(&format!("belongs to database {first_db}")),
        "{refused}"
    );
    let kept: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)",
    )
    .bind(names.slot.as_str())
    .fetch_one(&first.pool)
    .await
    .unwrap();
    assert!(kept, "the first outbox's slot is gone");

    // Its relay, told to use that slot, stops with the same reason instead of failing its
    // sessions for ever while it answers ready.
    let prefix = unique("p");
    let publisher = common::nats(NATS_URL, &unique("S")).await;
    let mut config = cdc_config(&second, &prefix);
    config.cdc.slot = Some(names.slot.as_str().to_owned());
    config.cdc.publication = Some(names.publication.as_str().to_owned());
    let relay = start(&second, publisher, config).await;
    stops_naming(relay, &first_db).await;

    // A relay that started while its slot was missing stops once a slot of that name is made
    // for the other database (it used to fail its sessions for ever).
    let late = CdcNames::new(
        &format!("{}_late", first.schema),
        names.publication.as_str(),
    )
    .unwrap();
    let mut config = cdc_config(&second, &prefix);
    config.cdc.slot = Some(late.slot.as_str().to_owned());
    config.cdc.publication = Some(names.publication.as_str().to_owned());
    let publisher = common::nats(NATS_URL, &unique("S")).await;
    let relay = start(&second, publisher, config).await;
    // Past its start (it checks the slot before it waits for its leases): it owns them.
    let owned = second.tables.render(
        "SELECT count(*) FILTER (WHERE owner IS NOT NULL AND expires_at > now()) = count(*) \
             FROM {schema}.leases",
    );
    wait_until(
        "the relay to own its leases",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar::<_, bool>(&owned)
                .fetch_one(&second.pool)
                .await
                .unwrap()
        },
    )
    .await;
    cdc::setup(&first.pool, &first.tables, &late).await.unwrap();
    stops_naming(relay, &first_db).await;

    second.pool.close().await;
    drop(second);
    drop(other);
}

#[tokio::test]
async fn a_second_database_gets_a_slot_of_its_own_by_default_and_its_relay_streams_it() {
    let first = outbox_on(&cdc_database_url(), 1).await;
    let names = CdcNames::resolve(&first.pool, &first.tables, None, None)
        .await
        .unwrap();
    assert_eq!(names, CdcNames::for_tables(&first.tables));
    cdc::setup(&first.pool, &first.tables, &names)
        .await
        .unwrap();

    // The same schema and table in another database: the default slot name is taken.
    let other = OtherDatabase::create().await;
    let pool = PgPool::connect(&other.url).await.unwrap();
    PgOutbox::new(first.tables.clone())
        .migrate(
            &pool,
            MigrateOptions {
                partitions: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // No schema to drop: the database goes whole.
    let second = TestDb {
        pool: pool.clone(),
        tables: first.tables.clone(),
        schema: String::new(),
        url: other.url.clone(),
    };
    let own = CdcNames::resolve(&pool, &second.tables, None, None)
        .await
        .unwrap();
    assert_ne!(
        own.slot, names.slot,
        "the second database took the first's slot"
    );
    assert!(
        own.slot.as_str().starts_with(names.slot.as_str()),
        "{own:?}"
    );
    assert_eq!(
        own.publication, names.publication,
        "publications are per database"
    );
    cdc::setup(&pool, &second.tables, &own).await.unwrap();
    // Set up again (`migrate --cdc` run twice), the recorded names stand.
    let again = CdcNames::resolve(&pool, &second.tables, None, None)
        .await
        .unwrap();
    assert_eq!(again, own);

    // Its relay, given no names, streams its own slot (it used to look for the first's).
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let publisher = common::nats(NATS_URL, &reader.stream).await;
    let mut config = cdc_config(&second, &prefix);
    config.schema = first.schema.clone();
    let relay = start(&second, publisher, config).await;
    let written = write(&second, WriteMode::Table, "order", 3, 2, 2).await;
    let got = reader.wait_for(written, WAIT).await;
    assert_eq!(got.len(), written);
    relay.shutdown().await.unwrap();
    reader.cleanup().await;

    // A logical slot keeps its database from being dropped.
    cdc::drop(&pool, &second.tables, &own).await.unwrap();
    pool.close().await;
    drop(second);
    drop(other);
}
