//! A relay retry that arrives while the first delivery is still being handled. The receiver
//! follows the verifier's protocol: verify; on `Ok`, handle, then `complete` the id, or
//! `forget` it and answer 500 when handling failed; on an error, answer `e.status()`. The first
//! handling is slower than `webhook.timeout` and fails: the relay's retry, with the same
//! `webhook-id`, is answered 503 (in flight), not 200, so the event is not marked published
//! until a delivery has been applied. G5: never acknowledged unapplied.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use http::{HeaderMap, HeaderName, HeaderValue};
use outbox_consumer::webhook::WebhookVerifier;
use outbox_relay::{
    publishers::webhook::{WebhookConfig, WebhookPublisher},
    retry::RetryPolicy,
    routing::RoutingConfig,
    Relay, RelayConfig,
};
use outbox_testkit::{wait_until, TestDb};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpListener,
};
use uuid::Uuid;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

async fn read_request<R: tokio::io::AsyncRead + Unpin>(
    read: &mut BufReader<R>,
) -> Option<(HeaderMap, Vec<u8>)> {
    let mut line = String::new();
    if read.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut headers = HeaderMap::new();
    loop {
        let mut line = String::new();
        read.read_line(&mut line).await.ok()?;
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).ok()?,
            HeaderValue::from_str(value.trim()).ok()?,
        );
    }
    let length = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    read.read_exact(&mut body).await.ok()?;
    Some((headers, body))
}

#[tokio::test]
async fn a_retry_while_the_first_delivery_is_handled_is_not_acknowledged() {
    let db = TestDb::new(2).await;
    let verifier = Arc::new(WebhookVerifier::new([SECRET]).unwrap());
    let applied = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    {
        let (verifier, applied, failed) = (verifier.clone(), applied.clone(), failed.clone());
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (verifier, applied, failed) =
                    (verifier.clone(), applied.clone(), failed.clone());
                tokio::spawn(async move {
                    let (read, mut write) = socket.into_split();
                    let mut read = BufReader::new(read);
                    while let Some((headers, body)) = read_request(&mut read).await {
                        let status = match verifier.verify(&headers, &body) {
                            Ok(v) => {
                                // The handler: the first attempt is slow (a lock wait, a slow
                                // database) and then fails; any later one succeeds.
                                if failed.fetch_add(1, Ordering::SeqCst) == 0 {
                                    tokio::time::sleep(Duration::from_secs(3)).await;
                                    verifier.forget(&v.id); // as the docs say
                                    500
                                } else {
                                    applied.fetch_add(1, Ordering::SeqCst);
                                    verifier.complete(&v.id);
                                    204
                                }
                            }
                            Err(e) => e.status().as_u16(), // InFlight → 503, Replayed → 200
                        };
                        let response = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                        if write.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
    let publisher = WebhookPublisher::new(WebhookConfig {
        url: format!("http://{addr}/hooks/{{destination}}"),
        secrets: vec![SECRET.into()],
        timeout: Duration::from_secs(1),
        ..Default::default()
    })
    .unwrap();
    sqlx::query(&db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
         payload, content_type, headers) VALUES ($1, 'order', 'o1', 'Placed', '\\x7b7d', \
         'application/json', '{}')",
    ))
    .bind(Uuid::now_v7())
    .execute(&db.pool)
    .await
    .unwrap();
    let config = RelayConfig {
        schema: db.schema.clone(),
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        poll_interval: Duration::from_millis(100),
        routing: RoutingConfig::default(),
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_transient_backoff: Duration::from_millis(200),
            ..Default::default()
        },
        ..Default::default()
    };
    let relay = Relay::new(db.pool.clone(), Arc::new(publisher), config)
        .await
        .unwrap()
        .spawn();
    wait_until(
        "the event to be published",
        Duration::from_secs(60),
        || async { db.count("published").await == 1 },
    )
    .await;
    // The event is published only once a delivery was applied: the first handling had failed
    // (and forgotten the id) before the retry that succeeded was accepted.
    relay.shutdown().await.unwrap();
    assert!(failed.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        applied.load(Ordering::SeqCst),
        1,
        "the relay marked the event published, yet the receiver never applied it \
         (its retry was answered 200 as a replay while the first delivery was still being \
         handled; that handling then failed)"
    );
}
