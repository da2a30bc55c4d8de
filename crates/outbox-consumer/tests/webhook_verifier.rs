//! The relay's signed webhook requests against the consumer's verifier, end to end: a row
//! inserted by SQL, the relay POSTing it to a raw TCP receiver on loopback that verifies each
//! request with `WebhookVerifier` and answers with the verdict's status. The relay's request is
//! accepted; the same bytes sent again are refused as a replay; a retry while the first
//! delivery is still being handled is not acknowledged.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use http::{HeaderMap, HeaderName, HeaderValue};
use outbox_consumer::webhook::{WebhookError, WebhookVerifier};
use outbox_relayer::{
    publishers::webhook::{WebhookConfig, WebhookPublisher},
    retry::RetryPolicy,
    routing::RoutingConfig,
    Relay, RelayConfig,
};
use outbox_testkit::{wait_until, TestDb};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);
const SECRETS: [&str; 2] = [
    // The new secret and the one being retired: the relay signs with both.
    "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
    "a raw signing secret of 33 bytes!",
];

/// One request as the receiver got it: its bytes, and the verifier's verdict.
type Seen = (Vec<u8>, Result<String, WebhookError>);

/// Reads one HTTP/1.1 request (body framed by `content-length`): its raw bytes, headers and
/// body; `None` at the end of the stream.
async fn read_request<R: tokio::io::AsyncRead + Unpin>(
    read: &mut BufReader<R>,
) -> Option<(Vec<u8>, HeaderMap, Vec<u8>)> {
    let mut raw = Vec::new();
    let mut line = String::new();
    if read.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    raw.extend_from_slice(line.as_bytes());
    let mut headers = HeaderMap::new();
    loop {
        let mut line = String::new();
        read.read_line(&mut line).await.ok()?;
        raw.extend_from_slice(line.as_bytes());
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
    raw.extend_from_slice(&body);
    Some((raw, headers, body))
}

/// A receiver that verifies every request, handles the accepted ones (successfully) and
/// answers with the verdict's status.
async fn receiver(verifier: Arc<WebhookVerifier>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (log, verifier) = (log.clone(), verifier.clone());
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut read = BufReader::new(read);
                while let Some((raw, headers, body)) = read_request(&mut read).await {
                    let verdict = verifier.verify(&headers, &body).map(|v| v.id);
                    let status = match &verdict {
                        // The handler (a no-op here) succeeded: the id is complete.
                        Ok(id) => {
                            verifier.complete(id);
                            204
                        }
                        Err(e) => e.status().as_u16(),
                    };
                    log.lock().unwrap().push((raw, verdict));
                    let response = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                    if write.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}/hooks/{{destination}}"), seen)
}

#[tokio::test]
async fn the_verifier_accepts_the_relays_request_and_refuses_its_replay() {
    let db = TestDb::new(2).await;
    // The receiver holds only the new secret; the relay still signs with the old one too.
    let verifier = Arc::new(WebhookVerifier::new(&SECRETS[..1]).unwrap());
    let (url, seen) = receiver(verifier).await;
    let publisher = WebhookPublisher::new(WebhookConfig {
        url: url.clone(),
        secrets: SECRETS.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
    .unwrap();
    let event_id = Uuid::now_v7();
    sqlx::query(&db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
         payload, content_type, headers) VALUES ($1, 'order', 'o1', 'Placed', $2, \
         'application/json', '{}')",
    ))
    .bind(event_id)
    .bind(&br#"{"total":42}"#[..])
    .execute(&db.pool)
    .await
    .unwrap();
    let config = RelayConfig {
        schema: db.schema.clone(),
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        poll_interval: Duration::from_millis(100),
        routing: RoutingConfig::default(),
        ..Default::default()
    };
    let relay = Relay::builder(db.pool.clone(), Arc::new(publisher), config)
        .build()
        .await
        .unwrap()
        .spawn();
    wait_until("the event to be published", WAIT, || async {
        db.count("published").await == 1
    })
    .await;
    relay.shutdown().await.unwrap();

    let (raw, verdict) = seen.lock().unwrap()[0].clone();
    assert_eq!(verdict, Ok(event_id.to_string()));

    // A captured request sent again, byte for byte, inside the window.
    let port = url.split(':').nth(2).unwrap().split('/').next().unwrap();
    let mut socket = TcpStream::connect(format!("127.0.0.1:{port}"))
        .await
        .unwrap();
    socket.write_all(&raw).await.unwrap();
    let mut answer = BufReader::new(socket);
    let mut status = String::new();
    answer.read_line(&mut status).await.unwrap();
    let log = seen.lock().unwrap().clone();
    assert_eq!(log.len(), 2, "{status}");
    assert_eq!(log[1].1, Err(WebhookError::Replayed(event_id.to_string())));
    // The verdict's status: a duplicate is acknowledged, not handled again.
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
}

/// A relay retry that arrives while the first delivery is still being handled. The receiver
/// follows the verifier's protocol: verify; on `Ok`, handle, then `complete` the id, or
/// `forget` it and answer 500 when handling failed; on an error, answer `e.status()`. The first
/// handling is slower than `webhook.timeout` and fails: the relay's retry, with the same
/// `webhook-id`, is answered 503 (in flight), not 200, so the event is not marked published
/// until a delivery has been applied. G5: never acknowledged unapplied.
#[tokio::test]
async fn a_retry_while_the_first_delivery_is_handled_is_not_acknowledged() {
    let db = TestDb::new(2).await;
    let verifier = Arc::new(WebhookVerifier::new([SECRETS[0]]).unwrap());
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
                    while let Some((_, headers, body)) = read_request(&mut read).await {
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
        secrets: vec![SECRETS[0].into()],
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
    let relay = Relay::builder(db.pool.clone(), Arc::new(publisher), config)
        .build()
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
