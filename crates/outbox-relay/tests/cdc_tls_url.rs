//! The CDC replication connection honours the TLS settings the relay's pool honours, in every
//! spelling sqlx reads (`sslmode=`, `ssl-mode=`): against a TLS-only server whose certificate
//! another CA signed, `verify-full` refuses to connect and publishes nothing.

mod common;

use std::{path::PathBuf, time::Duration};

use outbox_relay::Relay;
use outbox_testkit::{unique, NatsReader, PrivatePostgres, ServerTls, NATS_URL};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use sqlx::Connection;

struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    file: PathBuf,
}

impl TestCa {
    fn new() -> Self {
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

async fn walsenders(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_cdc_stream_honours_ssl_mode_verify_full_like_the_pool() {
    cdc_refuses("ssl-mode").await;
}

/// Control: the same with the spelling the replication client reads.
#[tokio::test]
async fn the_cdc_stream_honours_sslmode_verify_full() {
    cdc_refuses("sslmode").await;
}

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
    // The pool (sqlx) honours `ssl-mode` and refuses this server.
    let refused = sqlx::PgConnection::connect(&strict).await;
    assert!(refused.is_err(), "sqlx connected with {strict}");

    let prefix = unique("revtls");
    let reader = NatsReader::start(NATS_URL, &unique("REVTLS"), &prefix).await;
    let relay = Relay::new(
        db.pool.clone(),
        common::nats(NATS_URL, &reader.stream).await,
        common::cdc::cdc_config(&db, &prefix),
    )
    .await
    .expect("relay")
    .with_replication_url(&strict)
    .expect("replication url")
    .spawn();
    let written = common::cdc::write(&db, Default::default(), "order", 2, 2, 4).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let streams = walsenders(&db.pool).await;
    let delivered = reader.deliveries().len();
    relay.shutdown().await.ok();
    reader.cleanup().await;
    assert_eq!(
        (streams, delivered),
        (0, 0),
        "the replication stream connected ({streams} walsender) and published {delivered} of \
         {written} events to a server whose certificate the URL's sslrootcert did not sign \
         (ssl-mode=verify-full, which the pool refuses)"
    );
}
