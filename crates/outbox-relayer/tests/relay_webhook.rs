//! The relay against a real HTTP receiver on loopback.

mod common;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{body::Bytes, extract::State, http::HeaderMap, http::StatusCode, routing::post, Router};
use outbox::{Event, Outbox};
use outbox_relayer::publishers::webhook::{sign, WebhookConfig, WebhookPublisher};
use outbox_testkit::{unique, wait_until, TestDb};

const WAIT: Duration = Duration::from_secs(60);

/// A signing secret given as a raw string (its UTF-8 bytes are the key).
const SECRET: &str = "a raw signing secret of 33 bytes!";

/// One request as received: path, headers, body.
type Request = (String, HashMap<String, String>, Vec<u8>);

#[derive(Clone, Default)]
struct Receiver {
    /// Every request received.
    seen: Arc<Mutex<Vec<Request>>>,
    /// Remaining failures to answer per aggregate id, with the status to answer.
    script: Arc<Mutex<HashMap<String, (u32, u16)>>>,
}

async fn receive(
    State(r): State<Receiver>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let headers: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
        .collect();
    let aggregate = headers.get("aggregate-id").cloned().unwrap_or_default();
    r.seen
        .lock()
        .unwrap()
        .push((uri.path().to_owned(), headers, body.to_vec()));
    let mut script = r.script.lock().unwrap();
    match script.get_mut(&aggregate) {
        Some((left, status)) if *left > 0 => {
            *left -= 1;
            StatusCode::from_u16(*status).unwrap()
        }
        _ => StatusCode::NO_CONTENT,
    }
}

async fn serve(receiver: Receiver) -> String {
    let app = Router::new()
        .route("/hooks/{*rest}", post(receive))
        .with_state(receiver);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/hooks/{{destination}}")
}

#[tokio::test]
async fn posts_signed_events_retries_transient_statuses_and_dead_letters_permanent_ones() {
    let db = TestDb::new(4).await;
    let receiver = Receiver::default();
    receiver.script.lock().unwrap().extend([
        ("flaky".to_owned(), (2, 503)),
        ("gone".to_owned(), (u32::MAX, 404)),
    ]);
    let url = serve(receiver.clone()).await;
    let publisher = Arc::new(
        WebhookPublisher::new(WebhookConfig {
            url,
            secrets: vec![SECRET.into()],
            ..Default::default()
        })
        .unwrap(),
    );
    let outbox = db.outbox();
    let mut tx = db.pool.begin().await.unwrap();
    for aggregate in ["ok", "flaky", "gone"] {
        outbox
            .enqueue(
                &mut tx,
                &Event::new("order", aggregate, "Placed")
                    .json(&serde_json::json!({ "id": aggregate }))
                    .unwrap(),
            )
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let prefix = unique("p");
    let relay = common::start(&db, publisher, common::fast_config(&db, &prefix)).await;
    wait_until("two published and one dead", WAIT, || async {
        db.count("published").await == 2 && db.count("dead").await == 1
    })
    .await;
    relay.shutdown().await.unwrap();

    let seen = receiver.seen.lock().unwrap().clone();
    let of = |agg: &str| {
        seen.iter()
            .filter(|(_, h, _)| h["aggregate-id"] == agg)
            .cloned()
            .collect::<Vec<_>>()
    };
    let ok = &of("ok")[0];
    assert_eq!(ok.0, format!("/hooks/{prefix}.order.Placed"));
    assert_eq!(ok.2, br#"{"id":"ok"}"#);
    assert_eq!(ok.1["event-type"], "Placed");
    assert_eq!(ok.1["content-type"], "application/json");
    assert_eq!(ok.1["idempotency-key"], ok.1["event-id"]);
    assert_eq!(ok.1["webhook-id"], ok.1["event-id"]);
    let timestamp: i64 = ok.1["webhook-timestamp"].parse().unwrap();
    assert_eq!(
        ok.1["webhook-signature"],
        sign(&[SECRET.into()], &ok.1["event-id"], timestamp, &ok.2).unwrap()
    );
    assert!(!ok.1.contains_key("x-outbox-signature"), "retired");
    assert_eq!(of("flaky").len(), 3, "two 503s, then the 204");
    assert_eq!(
        of("gone").len(),
        3,
        "404 is permanent: max_attempts, then dead"
    );
    let error: String = sqlx::query_scalar(
        &db.tables
            .render("SELECT last_error FROM {schema}.{events} WHERE status = 'dead'"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(error, "permanent: webhook: HTTP 404 Not Found");
}
