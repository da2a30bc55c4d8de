//! Which database errors are an outage (waited out, no attempt spent) and which are the
//! message's own, on real PostgreSQL errors: the handler raises each SQLSTATE itself.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
    time::Duration,
};

use async_nats::{jetstream, HeaderMap};
use bytes::Bytes;
use futures::future::BoxFuture;
use outbox_consumer::{
    nats::{NatsConsumer, NatsSource},
    ConsumerConfig, Count, Envelope, Handler, HandlerError, Processor,
};
use outbox_testkit::{unique, wait_until, TestDb, NATS_URL};
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Raises the SQLSTATE named by the event's type (`raise-25006`) the first `fail` calls, then
/// records the event in `done`.
struct Raising {
    fail: u32,
    calls: AtomicU32,
    done_sql: String,
}

impl Handler for Raising {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            if call < self.fail {
                let code = event.event_type.trim_start_matches("raise-");
                sqlx::query(&format!(
                    "DO $$ BEGIN RAISE EXCEPTION 'raised on purpose' USING ERRCODE = '{code}'; END $$"
                ))
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(&self.done_sql)
                .bind(event.event_id)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}

async fn raising(db: &TestDb, fail: u32) -> Arc<Raising> {
    db.exec("CREATE TABLE {schema}.done (event_id uuid NOT NULL)")
        .await;
    Arc::new(Raising {
        fail,
        calls: AtomicU32::new(0),
        done_sql: db
            .tables
            .render("INSERT INTO {schema}.done (event_id) VALUES ($1)"),
    })
}

fn event(event_type: &str) -> Envelope {
    let id = Uuid::now_v7();
    let headers: BTreeMap<String, String> = [
        ("event-id".to_owned(), id.to_string()),
        ("event-type".to_owned(), event_type.to_owned()),
    ]
    .into();
    Envelope::decode("s", headers, Bytes::from_static(b"{}")).unwrap()
}

/// Before: a read-only database (a failover: 25006), a rejected password (28P01) or role
/// (28000), a full disk (53100) and a server out of memory (53200) were the message's fault:
/// each spent an attempt and, with enough of them, dead-lettered whole batches.
#[tokio::test]
async fn outages_of_every_class_are_the_infrastructures() {
    let db = TestDb::new(4).await;
    let processor = Processor::new(
        db.pool.clone(),
        &db.tables,
        "classes",
        raising(&db, 100).await,
    );
    for code in [
        "08006", "57P01", "53300", "25006", "28P01", "28000", "53100", "53200", "58030", "40001",
        "40P01",
    ] {
        let error = processor
            .apply(&event(&format!("raise-{code}")).to_message())
            .await
            .unwrap_err();
        assert!(error.is_infrastructure(), "{code}: {error}");
        assert!(!error.counts_as_attempt(), "{code}");
    }
    for code in ["23505", "22P02", "42703", "P0001"] {
        let error = processor
            .apply(&event(&format!("raise-{code}")).to_message())
            .await
            .unwrap_err();
        assert!(
            error.counts_as_attempt(),
            "{code} is the message's: {error}"
        );
    }
}

/// Before: a read-only database for four tries of one message spent its two attempts and
/// dead-lettered it.
#[tokio::test]
async fn a_read_only_database_spends_no_attempt() {
    let db = TestDb::new(4).await;
    let js = jetstream::new(async_nats::connect(NATS_URL).await.unwrap());
    let stream = unique("RO");
    let prefix = unique("ro");
    js.create_stream(jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{prefix}.>")],
        ..Default::default()
    })
    .await
    .unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("event-id", Uuid::now_v7().to_string().as_str());
    headers.insert("event-type", "raise-25006");
    js.publish_with_headers(format!("{prefix}.x"), headers, "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let processor = Processor::new(
        db.pool.clone(),
        &db.tables,
        "read-only",
        raising(&db, 4).await,
    );
    let metrics = processor.metrics().clone();
    let config = ConsumerConfig {
        max_attempts: 2,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        ..ConsumerConfig::new("read-only")
    };
    let consumer = NatsConsumer::connect(NatsSource::new(NATS_URL, &stream), config, processor)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    wait_until("applied or dead", Duration::from_secs(60), || async {
        metrics.count("read-only", Count::Handled) == 1
            || metrics.count("read-only", Count::DeadLettered) == 1
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(metrics.count("read-only", Count::DeadLettered), 0);
    assert_eq!(metrics.count("read-only", Count::Failures), 0);
    assert_eq!(metrics.count("read-only", Count::InfrastructureFailures), 4);
    let done: i64 = sqlx::query_scalar(&db.tables.render("SELECT count(*) FROM {schema}.done"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(done, 1);
    let _ = js.delete_stream(&stream).await;
    let _ = js.delete_stream(format!("{stream}_DEAD_read-only")).await;
}
