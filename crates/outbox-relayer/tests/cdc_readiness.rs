//! `/readyz` of a CDC relay held against what it does (G7): a statement the database refuses
//! for ever, the database being up, reads as `stalled` once nothing is published for the
//! stall timeout, and the relay is ready again once the statement goes through. On the
//! private logical PostgreSQL and NATS.

mod common;

use std::time::Duration;

use common::cdc::{cdc_config, cdc_db, write, WAIT};
use outbox::postgres::WriteMode;
use outbox_relayer::Relay;
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
    let relay = Relay::builder(db.pool.clone(), publisher, config)
        .replication_url(&db.url)
        .build()
        .await
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

/// A TCP proxy to `upstream` that stops forwarding, both ways, while its switch is on: a
/// connection that stays open and carries nothing (a half-open socket, a stuck middlebox).
struct FreezingProxy {
    addr: std::net::SocketAddr,
    frozen: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl FreezingProxy {
    async fn start(upstream: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (frozen, watch) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pipe(client_read, server_write, watch.clone()));
                tokio::spawn(pipe(server_read, client_write, watch.clone()));
            }
        });
        Self { addr, frozen, task }
    }
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding what it read while the proxy is frozen.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// The replication connection goes silent (open, carrying nothing): the relay, which once
/// answered ready for as long as it lasted, reconnects and says it is not ready meanwhile.
#[tokio::test]
async fn a_replication_stream_that_goes_silent_is_not_ready_and_is_reconnected() {
    let db = cdc_db(1).await;
    let url = url::Url::parse(&db.url).unwrap();
    let upstream = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432))
        .parse()
        .unwrap();
    let proxy = FreezingProxy::start(upstream).await;
    let mut through = url.clone();
    through.set_port(Some(proxy.addr.port())).unwrap();
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let publisher = common::nats(NATS_URL, &reader.stream).await;
    let mut config = cdc_config(&db, &prefix);
    config.stall_timeout = Duration::from_secs(2);
    let relay = Relay::builder(db.pool.clone(), publisher, config)
        .replication_url(through.as_str())
        .build()
        .await
        .unwrap();
    let (health, metrics) = (relay.health(), relay.metrics());
    let relay = relay.spawn();
    let before = write(&db, WriteMode::Table, "early", 2, 1, 2).await;
    reader.wait_for(before, WAIT).await;
    proxy.frozen.send_replace(true);
    let during = write(&db, WriteMode::Table, "late", 2, 2, 4).await;
    wait_until("readiness to see the silent stream", WAIT, || async {
        health.readiness().is_err()
    })
    .await;
    let failed = metrics.database_errors.get();
    proxy.frozen.send_replace(false);
    let got = reader.wait_for(before + during, WAIT).await;
    assert_eq!(got.len(), before + during);
    assert!(failed >= 1, "the silent session was given up");
    wait_until("the relay to be ready again", WAIT, || async {
        health.readiness().is_ok()
    })
    .await;
    relay.shutdown().await.unwrap();
    reader.cleanup().await;
}
