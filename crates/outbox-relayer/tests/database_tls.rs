//! TLS to the databases, checked from the server's side: private PostgreSQL and MariaDB servers
//! that refuse every connection without TLS, certificates made by the test (a CA of its own,
//! a server certificate for `localhost`), the relay's pool and its CDC replication connection
//! encrypted, `sslmode` / `ssl-mode` honoured (verified against the CA, refused with another
//! CA, refused when TLS is turned off), and events published end to end over TLS.

mod common;

use std::{path::PathBuf, time::Duration};

use outbox::{mysql::MySqlOutbox, postgres::MigrateOptions, Event, Outbox, Tables};
use outbox_relayer::{Relay, RelayConfig};
use outbox_testkit::{
    unique, wait_until, NatsReader, PrivateMariaDb, PrivatePostgres, ServerTls, NATS_URL,
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use sqlx::{
    mysql::{MySqlConnectOptions, MySqlPoolOptions},
    postgres::PgPoolOptions,
    ConnectOptions, Connection,
};

const WAIT: Duration = Duration::from_secs(60);

/// A certificate authority of the test's own, its certificate in a PEM file (removed on drop).
struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    file: PathBuf,
}

impl TestCa {
    fn new() -> Self {
        // The process's TLS provider, as the `outbox` binary installs it: sqlx's certificate
        // verifiers take the process default.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, unique("outbox test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let file = std::env::temp_dir().join(format!("{}.pem", unique("ca")));
        std::fs::write(&file, cert.pem()).unwrap();
        Self {
            issuer: Issuer::new(params, key),
            file,
        }
    }

    /// A server certificate for `localhost` and 127.0.0.1, signed by this CA.
    fn server(&self) -> ServerTls {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        ServerTls {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    fn path(&self) -> &str {
        self.file.to_str().unwrap()
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// `url` (the private server's, on 127.0.0.1) naming the server `localhost`, as its
/// certificate does, with `query` appended.
fn on_localhost(url: &str, query: &str) -> String {
    let url = url.replace("127.0.0.1", "localhost");
    if query.is_empty() {
        url
    } else {
        format!("{url}?{query}")
    }
}

/// How many of the server's client backends (`backend_type`) run with and without TLS.
async fn pg_connections(pool: &sqlx::PgPool, backend_type: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
         FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.backend_type = $1",
    )
    .bind(backend_type)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The error of opening one connection to `url`, as text (the test fails if it opens).
async fn pg_refusal(url: &str) -> String {
    match sqlx::PgConnection::connect(url).await {
        Ok(_) => panic!("{url} connected"),
        Err(error) => error.to_string(),
    }
}

#[tokio::test]
async fn the_relay_publishes_over_verified_tls_to_a_postgres_that_refuses_plain_connections() {
    let ca = TestCa::new();
    let server = PrivatePostgres::start_tls_only(&[], &ca.server()).await;
    let url = on_localhost(
        &server.url(),
        &format!("sslmode=verify-full&sslrootcert={}", ca.path()),
    );
    let db = outbox_testkit::TestDb::on(
        &url,
        MigrateOptions {
            partitions: Some(4),
            ..Default::default()
        },
    )
    .await;
    let prefix = unique("tls");
    let reader = NatsReader::start(NATS_URL, &unique("TLS"), &prefix).await;
    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    let events: Vec<Event> = (0..20)
        .map(|i| Event::new("order", format!("o{i}"), "Placed"))
        .collect();
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox().enqueue_batch(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    reader.wait_for(events.len(), WAIT).await;
    wait_until("the events marked published", WAIT, || async {
        db.count("published").await == events.len() as i64
    })
    .await;
    let (encrypted, plain) = pg_connections(&db.pool, "client backend").await;
    assert!(encrypted > 0, "the relay's pool is connected");
    assert_eq!(plain, 0, "no connection of the relay is without TLS");
    relay.shutdown().await.unwrap();
    reader.cleanup().await;
}

#[tokio::test]
async fn the_pool_honours_sslmode_and_refuses_a_server_its_ca_did_not_sign() {
    let ca = TestCa::new();
    let server = PrivatePostgres::start_tls_only(&[], &ca.server()).await;
    let base = server.url();
    for query in [
        String::new(),
        "sslmode=require".to_owned(),
        format!("sslmode=verify-ca&sslrootcert={}", ca.path()),
        format!("sslmode=verify-full&sslrootcert={}", ca.path()),
    ] {
        let url = on_localhost(&base, &query);
        let pool = PgPoolOptions::new().connect(&url).await.unwrap();
        let ssl: bool =
            sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert!(ssl, "{query:?}: the connection uses TLS");
        pool.close().await;
    }
    let other = TestCa::new();
    let wrong_ca = pg_refusal(&on_localhost(
        &base,
        &format!("sslmode=verify-full&sslrootcert={}", other.path()),
    ))
    .await;
    assert!(
        wrong_ca.contains("certificate") && wrong_ca.contains("UnknownIssuer"),
        "a server signed by another CA is refused, saying why: {wrong_ca}"
    );
    let plain = pg_refusal(&on_localhost(&base, "sslmode=disable")).await;
    assert!(
        plain.contains("no encryption") || plain.contains("pg_hba.conf"),
        "the TLS-only server refuses a plain connection, saying why: {plain}"
    );
}

#[tokio::test]
async fn the_cdc_replication_connection_uses_tls_when_the_url_names_no_sslmode() {
    let ca = TestCa::new();
    let server = PrivatePostgres::start_tls_only(&["wal_level=logical"], &ca.server()).await;
    // No sslmode: libpq's default, `prefer`, tries TLS first.
    let db = common::cdc::with_slot(common::cdc::outbox_on(&server.url(), 4).await).await;
    let prefix = unique("tlscdc");
    let reader = NatsReader::start(NATS_URL, &unique("TLSCDC"), &prefix).await;
    let relay = common::cdc::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::cdc::cdc_config(&db, &prefix),
    )
    .await;
    wait_until("the replication connection", WAIT, || async {
        pg_connections(&db.pool, "walsender").await.0 > 0
    })
    .await;
    let written = common::cdc::write(&db, Default::default(), "order", 5, 4, 7).await;
    reader.wait_for(written, WAIT).await;
    assert_eq!(
        pg_connections(&db.pool, "walsender").await.1,
        0,
        "the replication stream is encrypted"
    );
    assert_eq!(pg_connections(&db.pool, "client backend").await.1, 0);
    relay.shutdown().await.unwrap();
    reader.cleanup().await;
}

#[tokio::test]
async fn the_relay_publishes_over_verified_tls_to_a_mariadb_that_requires_secure_transport() {
    let ca = TestCa::new();
    let server = PrivateMariaDb::start_tls_only(&[], &ca.server()).await;
    let url = on_localhost(
        &server.url(),
        &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", ca.path()),
    );
    let options: MySqlConnectOptions = url.parse().unwrap();
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .connect_with(options.clone())
        .await
        .unwrap();
    let tables = Tables::default();
    MySqlOutbox::new(tables.clone())
        .migrate(
            &pool,
            MigrateOptions {
                partitions: Some(4),
                time_partition_days: None,
            },
        )
        .await
        .unwrap();
    let prefix = unique("tlsmy");
    let reader = NatsReader::start(NATS_URL, &unique("TLSMY"), &prefix).await;
    let relay = Relay::builder(
        pool.clone(),
        common::nats(NATS_URL, &reader.stream).await,
        RelayConfig {
            relay_id: Some("tls".into()),
            ..common::fast_config_for("outbox", &prefix)
        },
    )
    .build()
    .await
    .unwrap()
    .spawn();
    let events: Vec<Event> = (0..20)
        .map(|i| Event::new("order", format!("o{i}"), "Placed"))
        .collect();
    let mut tx = pool.begin().await.unwrap();
    MySqlOutbox::new(tables.clone())
        .enqueue_batch(&mut tx, &events)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    reader.wait_for(events.len(), WAIT).await;
    // Every connection of the pool is encrypted: hold them all and ask each.
    let mut held = Vec::new();
    for _ in 0..pool.size() {
        held.push(pool.acquire().await.unwrap());
    }
    for conn in &mut held {
        let (_, cipher): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            .fetch_one(&mut **conn)
            .await
            .unwrap();
        assert!(!cipher.is_empty(), "a connection of the relay without TLS");
    }
    drop(held);
    relay.shutdown().await.unwrap();
    reader.cleanup().await;

    let other = TestCa::new();
    let wrong_ca: MySqlConnectOptions = on_localhost(
        &server.url(),
        &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", other.path()),
    )
    .parse()
    .unwrap();
    let error = wrong_ca.connect().await.expect_err("refused").to_string();
    assert!(
        error.contains("certificate") && error.contains("UnknownIssuer"),
        "a server signed by another CA is refused, saying why: {error}"
    );
    let plain: MySqlConnectOptions = on_localhost(&server.url(), "ssl-mode=DISABLED")
        .parse()
        .unwrap();
    let error = plain.connect().await.expect_err("refused").to_string();
    // MySQL answers "insecure transport are prohibited"; MariaDB 10.11 an access denied.
    assert!(
        error.contains("insecure transport") || error.contains("Access denied"),
        "the server refuses a plain connection: {error}"
    );
}

/// The CDC replication connection reads the URL as the pool does, in either spelling
/// (`ssl-mode=`, sqlx's, and `sslmode=`, libpq's).
#[tokio::test]
async fn the_cdc_stream_honours_ssl_mode_verify_full_like_the_pool() {
    cdc_refuses("ssl-mode").await;
}

#[tokio::test]
async fn the_cdc_stream_honours_sslmode_verify_full() {
    cdc_refuses("sslmode").await;
}

/// Against a TLS-only server whose certificate another CA signed, `{key}=verify-full` refuses
/// to connect, in the pool and in the replication stream, and nothing is published. Proving
/// that nothing connects takes a window: the relay retries its stream within it.
async fn cdc_refuses(key: &str) {
    let ca = TestCa::new();
    let other = TestCa::new();
    let server = PrivatePostgres::start_tls_only(&["wal_level=logical"], &ca.server()).await;
    let db = common::cdc::with_slot(common::cdc::outbox_on(&server.url(), 4).await).await;
    // The URL an operator writes: verify the server against `other` (which did not sign it).
    let strict = format!(
        "{}?{key}=verify-full&sslrootcert={}",
        db.url.replace("127.0.0.1", "localhost"),
        other.path()
    );
    let refused = sqlx::PgConnection::connect(&strict).await;
    assert!(refused.is_err(), "sqlx connected with {strict}");

    let prefix = unique("cdctls");
    let reader = NatsReader::start(NATS_URL, &unique("CDCTLS"), &prefix).await;
    let relay = Relay::builder(
        db.pool.clone(),
        common::nats(NATS_URL, &reader.stream).await,
        common::cdc::cdc_config(&db, &prefix),
    )
    .replication_url(&strict)
    .build()
    .await
    .expect("relay")
    .spawn();
    let written = common::cdc::write(&db, Default::default(), "order", 2, 2, 4).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (encrypted, plain) = pg_connections(&db.pool, "walsender").await;
    let streams = encrypted + plain;
    let delivered = reader.deliveries().len();
    relay.shutdown().await.ok();
    reader.cleanup().await;
    assert_eq!(
        (streams, delivered),
        (0, 0),
        "the replication stream connected ({streams} walsender) and published {delivered} of \
         {written} events to a server whose certificate the URL's sslrootcert did not sign \
         ({key}=verify-full, which the pool refuses)"
    );
}
