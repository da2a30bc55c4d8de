//! `/readyz` of a CDC relay held against what it does (G7): a statement the database refuses
//! for ever, the database being up, reads as `stalled` once nothing is published for the
//! stall timeout, and the relay is ready again once the statement goes through. On the
//! private logical PostgreSQL and NATS.

mod common;

use std::time::Duration;

use common::cdc::{cdc_config, cdc_db, write, WAIT};
use outbox::postgres::WriteMode;
use outbox_relay::Relay;
use outbox_testkit::{unique, wait_until, NatsReader, NATS_URL};
use sqlx::Executor;

#[tokio::test]
async fn a_mark_the_database_refuses_for_ever_reads_as_stalled_and_recovers() {
    let db = cdc_db(1).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let publisher = common::nats(NATS_URL, &reader.stream).await;
    let mut config = cdc_config(&db, &prefix);
    config.stall_timeout = Duration::from_secs(2);
    let relay = Relay::new(db.pool.clone(), publisher, config)
        .await
        .unwrap()
        .with_replication_url(&db.url)
        .unwrap();
    let health = relay.health();
    let relay = relay.spawn();
    // Every mark of a published row fails, as a constraint or a trigger of the team's would.
    db.pool
        .execute(sqlx::raw_sql(&db.tables.render(
            "CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$;
             CREATE TRIGGER refuse BEFORE UPDATE ON {schema}.{events}
                 FOR EACH ROW EXECUTE FUNCTION {schema}.refuse();",
        )))
        .await
        .unwrap();
    let written = write(&db, WriteMode::Table, "order", 2, 2, 4).await;
    reader.wait_for(written, WAIT).await;
    // Before, the relay answered ready for as long as the mark was retried: it counted work
    // as seen only when it published.
    wait_until(
        "readiness to say the relay is stalled",
        Duration::from_secs(30),
        || async { health.readiness().is_err_and(|n| n.reason == "stalled") },
    )
    .await;
    db.pool
        .execute(sqlx::raw_sql(
            &db.tables.render("DROP TRIGGER refuse ON {schema}.{events}"),
        ))
        .await
        .unwrap();
    let pending = db
        .tables
        .render("SELECT count(*) FROM {schema}.{events} WHERE status = 'pending'");
    wait_until("the marks to go through", WAIT, || async {
        sqlx::query_scalar::<_, i64>(&pending)
            .fetch_one(&db.pool)
            .await
            .unwrap()
            == 0
    })
    .await;
    wait_until("the relay to be ready again", WAIT, || async {
        health.readiness().is_ok()
    })
    .await;
    relay.shutdown().await.unwrap();
    reader.cleanup().await;
}
