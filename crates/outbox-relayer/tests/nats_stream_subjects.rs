//! What a writer's destination may do to the relay's JetStream stream. With `create_stream`
//! (the default) each new subject's first token is added to the stream as `<token>.>`:
//! `nats.subject_prefixes` keeps a writer from adding another application's subjects (a core
//! NATS service's requests would be stored, and answered, by the relay's stream), and a token
//! another stream already takes is a dead letter naming the clash, not a transient failure
//! retried forever with its aggregate blocked.

mod common;

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use outbox_relayer::publishers::nats::{NatsConfig, NatsPublisher};
use outbox_testkit::{unique, wait_until, NatsReader, TestDb, NATS_URL};
use uuid::Uuid;

async fn insert(db: &TestDb, aggregate_id: &str, destination: &str) -> i64 {
    let sql = db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
         destination, payload, content_type, headers) VALUES ($1, 'order', $2, 'Placed', $3, \
         '\\x7b7d', 'application/json', '{}') RETURNING id",
    );
    sqlx::query_scalar(&sql)
        .bind(Uuid::now_v7())
        .bind(aggregate_id)
        .bind(destination)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

async fn row(db: &TestDb, id: i64) -> (String, i32, Option<String>) {
    sqlx::query_as(
        &db.tables
            .render("SELECT status, attempts, last_error FROM {schema}.{events} WHERE id = $1"),
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// A core-NATS service answers requests on `svc.echo`. With `subject_prefixes` naming the
/// relay's own tokens, a writer's row with destination `svc.anything` is a dead letter and the
/// stream never takes `svc.>`: the service's requests stay the service's.
#[tokio::test]
async fn with_subject_prefixes_a_writer_cannot_make_the_stream_take_a_services_subjects() {
    let db = TestDb::new(2).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let client = async_nats::connect(NATS_URL).await.unwrap();
    let service = unique("svc");
    let mut requests = client.subscribe(format!("{service}.echo")).await.unwrap();
    let responder = {
        let client = client.clone();
        tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                if let Some(reply) = request.reply {
                    client.publish(reply, "pong".into()).await.unwrap();
                }
            }
        })
    };
    client.flush().await.unwrap();
    let id = insert(&db, "w1", &format!("{service}.anything")).await;
    let fine = insert(&db, "w2", &format!("{prefix}.order.Placed")).await;
    let publisher = NatsPublisher::connect(NatsConfig {
        url: NATS_URL.into(),
        stream: reader.stream.clone(),
        ack_timeout: Duration::from_secs(2),
        subject_prefixes: vec![format!("{prefix}.")],
        ..Default::default()
    })
    .await
    .unwrap();
    let relay = common::start(
        &db,
        std::sync::Arc::new(publisher),
        common::fast_config(&db, &prefix),
    )
    .await;
    wait_until("both rows to settle", Duration::from_secs(30), || async {
        row(&db, id).await.0 == "dead" && row(&db, fine).await.0 == "published"
    })
    .await;
    relay.shutdown().await.unwrap();
    let error = row(&db, id).await.2.unwrap_or_default();
    assert!(error.contains("nats.subject_prefixes"), "{error}");
    let js = jetstream::new(client.clone());
    let mut s = js.get_stream(&reader.stream).await.unwrap();
    let subjects = s.info().await.unwrap().config.subjects.clone();
    responder.abort();
    reader.cleanup().await;
    assert!(
        !subjects.iter().any(|subject| subject.starts_with(&service)),
        "the relay's stream took the service's subjects: {subjects:?}"
    );
}

/// Another stream takes `v.a`. A writer's destination `v.b` makes the relay try to add `v.>`
/// to its stream, which the server refuses (overlapping subjects): a dead letter naming the
/// clash, within `max_attempts`, not a transient failure retried forever.
#[tokio::test]
async fn a_destination_overlapping_another_stream_is_a_dead_letter() {
    let db = TestDb::new(2).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let client = async_nats::connect(NATS_URL).await.unwrap();
    let js = jetstream::new(client.clone());
    let other = unique("V");
    let token = unique("v");
    js.create_stream(stream::Config {
        name: other.clone(),
        subjects: vec![format!("{token}.a")],
        ..Default::default()
    })
    .await
    .unwrap();
    let id = insert(&db, "w2", &format!("{token}.b")).await;
    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix), // max_attempts 3
    )
    .await;
    wait_until(
        "the row to be a dead letter",
        Duration::from_secs(30),
        || async { row(&db, id).await.0 == "dead" },
    )
    .await;
    let (_, _, error) = row(&db, id).await;
    relay.shutdown().await.unwrap();
    js.delete_stream(&other).await.unwrap();
    reader.cleanup().await;
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains("another stream")),
        "{error:?}"
    );
}
