//! `outbox doctor` against real misconfigurations, and the relay's first-run messages: each
//! planted mistake is named on its line, with the exit code a script relies on.

mod support;

use std::time::Duration;

use outbox_testkit::{database_url, unique, wait_until, TestDb, NATS_URL};
use support::{http_get, run};

const RABBITMQ_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The printed line of the check `prefix` (`"✗ database reachable"`), or a panic showing all.
fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{text}"))
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn config(text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("{}.toml", unique("doctor")));
    std::fs::write(&path, text).unwrap();
    path
}

async fn write_event(db: &TestDb, aggregate_type: &str) {
    db.exec(&format!(
        "INSERT INTO {{schema}}.{{events}} (event_id, aggregate_type, aggregate_id, \
         aggregate_version, event_type, payload) \
         VALUES (gen_random_uuid(), '{aggregate_type}', '1', 1, 'Placed', '{{}}')"
    ))
    .await;
}

#[tokio::test]
async fn a_healthy_set_up_passes_with_exit_0() {
    let db = TestDb::new(4).await;
    write_event(&db, &unique("agg")).await;
    let out = run(&[
        "doctor",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
        "--broker-url",
        NATS_URL,
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        line(&text, "✓ database reachable").contains("PostgreSQL"),
        "{text}"
    );
    line(&text, "✓ database migrations: current");
    line(&text, "✓ database privileges");
    line(&text, "✓ database backlog: 1 pending");
    line(&text, "✓ broker JetStream");
    // The stream does not capture the new aggregate's subject yet: the relay adds it.
    assert!(line(&text, "✓ broker subject").contains("adds"), "{text}");
    // Nobody relays the pending event: a warning, not a failure.
    line(
        &text,
        "⚠ relays alive: no relay holds a lease, and 1 events are pending",
    );
    assert!(text.ends_with("0 failed\n"), "{text}");
}

#[tokio::test]
async fn a_wrong_database_port_names_the_refused_address() {
    let port = closed_port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    let out = run(&["doctor", "--database-url", &url]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let reachable = line(&text, "✗ database reachable");
    assert!(reachable.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(reachable.contains("Connection refused"), "{text}");
    assert!(text.contains("fix: start the database server"), "{text}");
}

#[tokio::test]
async fn a_missing_migration_is_named_with_the_command_that_applies_it() {
    let db = TestDb::new(2).await;
    db.exec("DELETE FROM {schema}.migrations WHERE version = (SELECT max(version) FROM {schema}.migrations)")
        .await;
    let out = run(&["doctor", "--database-url", &db.url, "--schema", &db.schema]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let latest = outbox::postgres::MIGRATIONS.last().unwrap();
    let migrations = line(&text, "✗ database migrations");
    assert!(
        migrations.contains(&format!("missing: {} ({})", latest.0, latest.1)),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "fix: outbox migrate --database-url … --schema {}",
            db.schema
        )),
        "{text}"
    );
    // A schema never migrated at all.
    let out = run(&[
        "doctor",
        "--database-url",
        &database_url(),
        "--schema",
        &unique("none"),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        line(&text, "✗ database migrations").contains("not migrated"),
        "{text}"
    );
}

#[tokio::test]
async fn cdc_checks_name_wal_level_and_a_user_without_replication() {
    let db = TestDb::new(2).await;
    // The shared server runs with wal_level = replica.
    let out = run(&[
        "doctor",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
        "--mode",
        "cdc",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        line(&text, "✗ cdc wal_level").contains("'replica'"),
        "{text}"
    );
    assert!(
        text.contains("fix: ALTER SYSTEM SET wal_level = logical"),
        "{text}"
    );
    line(&text, &format!("✗ cdc slot {}_events: missing", db.schema));

    // A user that may log in but neither stream changes nor touch the outbox's tables.
    let role = unique("doc");
    db.exec(&format!("CREATE ROLE {role} LOGIN NOREPLICATION"))
        .await;
    let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    let out = run(&[
        "doctor",
        "--database-url",
        &url,
        "--schema",
        &db.schema,
        "--mode",
        "cdc",
    ]);
    let text = stdout(&out);
    db.exec(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        line(&text, "✗ cdc REPLICATION").contains(&format!("user {role} lacks the REPLICATION")),
        "{text}"
    );
    assert!(
        text.contains(&format!("fix: ALTER ROLE \"{role}\" REPLICATION;")),
        "{text}"
    );
    assert!(
        line(&text, "✗ database privileges").contains("events"),
        "{text}"
    );
}

#[tokio::test]
async fn a_missing_stream_and_an_uncaptured_subject_fail_when_the_relay_may_not_create_them() {
    let db = TestDb::new(2).await;
    let aggregate = unique("agg");
    write_event(&db, &aggregate).await;
    let stream = unique("DOC").to_uppercase();
    let path = config(&format!(
        "[nats]\nstream = \"{stream}\"\ncreate_stream = false\n"
    ));
    let out = run(&[
        "doctor",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
        "--broker-url",
        NATS_URL,
        "--config",
        path.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&path);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        line(&text, &format!("✗ broker stream {stream}")).contains("missing"),
        "{text}"
    );
    assert!(
        line(&text, &format!("✗ broker subject {aggregate}.Placed"))
            .contains("no stream captures it"),
        "{text}"
    );
}

#[tokio::test]
async fn a_missing_exchange_fails_when_the_relay_may_not_declare_it() {
    let db = TestDb::new(2).await;
    let exchange = unique("doc");
    let path = config(&format!(
        "[rabbitmq]\nexchange = \"{exchange}\"\ndeclare_exchange = false\n"
    ));
    let out = run(&[
        "doctor",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
        "--broker-url",
        RABBITMQ_URL,
        "--config",
        path.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&path);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    line(
        &text,
        "✓ broker connection: RabbitMQ accepted the credentials",
    );
    assert!(
        line(&text, &format!("✗ broker exchange {exchange}")).contains("missing"),
        "{text}"
    );
    // Wrong credentials are told apart from an unreachable server.
    let out = run(&[
        "doctor",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
        "--broker-url",
        "amqp://guest:wrong@127.0.0.1:5672/%2f",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    line(&text, "✓ broker reachable");
    assert!(
        line(&text, "✗ broker connection").contains("ACCESS_REFUSED"),
        "{text}"
    );
}

#[tokio::test]
async fn a_wrong_broker_port_and_a_network_listen_without_token_fail() {
    let db = TestDb::new(2).await;
    let port = closed_port();
    let broker = format!("nats://127.0.0.1:{port}");
    let args = [
        "doctor",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
        "--broker-url",
        &broker,
        "--listen",
        "0.0.0.0:9187",
        "--json",
    ];
    let out = support::bin()
        .args(args)
        .env_remove("OUTBOX_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let find = |area: &str, name: &str| {
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["area"] == area && c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {area} {name} in {doc}"))
    };
    let reachable = find("broker", "reachable");
    assert_eq!(reachable["level"], "fail");
    let detail = reachable["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("connection refused at 127.0.0.1:{port}")),
        "{detail}"
    );
    let listen = find("config", "listen");
    assert_eq!(listen["level"], "fail");
    assert!(listen["fix"]
        .as_str()
        .unwrap()
        .contains("OUTBOX_ADMIN_TOKEN"));
    assert_eq!(doc["failed"], 2, "{doc}");

    // With a token, a network listen passes.
    let out = support::bin()
        .args(args)
        .env("OUTBOX_ADMIN_TOKEN", "s3cret-token")
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listen = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "listen")
        .unwrap()
        .clone();
    assert_eq!(listen["level"], "ok", "{doc}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("s3cret-token"));
}

#[test]
fn bad_input_exits_2() {
    let out = support::bin()
        .args(["doctor"])
        .env_remove("OUTBOX_DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pass --database-url"));
    let path = config("[relay]\nmax_batch_sise = 5\n");
    let out = run(&[
        "doctor",
        "--database-url",
        &database_url(),
        "--config",
        path.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_batch_sise"));
}

/// The relay with a wrong database port: /healthz answers, /readyz names the address and the
/// cause, and so does a WARN line from the first attempt.
#[tokio::test]
async fn a_relay_waiting_for_its_database_is_alive_and_says_why_it_is_not_ready() {
    let port = closed_port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    let listen = format!("127.0.0.1:{}", closed_port());
    let path = config("");
    let relay =
        support::RelayProcess::start_on(&["--database-url", &url], NATS_URL, &path, &listen, &[]);
    wait_until(
        "/readyz names the database",
        Duration::from_secs(10),
        || async {
            http_get(&listen, "/readyz")
                .await
                .is_some_and(|(status, body)| {
                    status == 503
                        && body.contains(&format!("waiting for the database at 127.0.0.1:{port}"))
                        && body.contains("Connection refused")
                })
        },
    )
    .await;
    assert_eq!(http_get(&listen, "/healthz").await.unwrap().0, 200);
    let log = relay.log();
    let warn = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("cannot reach the database"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(warn.contains(&format!("127.0.0.1:{port}")), "{warn}");
    assert!(warn.contains("Connection refused"), "{warn}");
    drop(relay);
    let _ = std::fs::remove_file(&path);
}

/// The relay with a wrong broker port: started, not ready, the cause at WARN.
#[tokio::test]
async fn a_relay_whose_broker_is_unreachable_is_not_ready_and_says_why() {
    let db = TestDb::new(2).await;
    let port = closed_port();
    let broker = format!("nats://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{}", closed_port());
    let path = config("");
    let relay = support::RelayProcess::start(&db, &broker, &path, &listen);
    wait_until(
        "/readyz names the broker",
        Duration::from_secs(10),
        || async {
            http_get(&listen, "/readyz")
                .await
                .is_some_and(|(status, body)| {
                    status == 503
                        && body.contains(&format!(
                            "broker unreachable: connection refused at 127.0.0.1:{port}"
                        ))
                })
        },
    )
    .await;
    let metrics = http_get(&listen, "/metrics").await.unwrap().1;
    assert!(
        metrics.contains("outbox_unready{reason=\"broker\"} 1"),
        "{metrics}"
    );
    let log = relay.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains(&format!("connection refused at 127.0.0.1:{port}"))),
        "{log}"
    );
    drop(relay);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_cdc_set_up_on_a_logical_server_passes() {
    let db = TestDb::on(
        &outbox_testkit::cdc_database_url(),
        outbox::postgres::MigrateOptions {
            partitions: Some(2),
            ..Default::default()
        },
    )
    .await;
    let base = ["--database-url", &db.url, "--schema", &db.schema];
    let setup = run(&[&["migrate", "--cdc"][..], &base[..]].concat());
    assert!(setup.status.success(), "{setup:?}");
    let out = run(&[&["doctor", "--mode", "cdc"][..], &base[..]].concat());
    let text = stdout(&out);
    let drop_cdc = run(&[&["migrate", "--drop-cdc"][..], &base[..]].concat());
    assert!(drop_cdc.status.success(), "{drop_cdc:?}");
    assert_eq!(out.status.code(), Some(0), "{text}");
    line(&text, "✓ cdc wal_level: logical");
    line(&text, "✓ cdc REPLICATION");
    line(
        &text,
        &format!("✓ cdc publication {}_events: exists", db.schema),
    );
    assert!(
        line(&text, &format!("✓ cdc slot {}_events", db.schema)).contains("no relay"),
        "{text}"
    );
}

#[tokio::test]
async fn a_missing_kafka_topic_fails() {
    let db = TestDb::new(2).await;
    let aggregate = unique("agg");
    write_event(&db, &aggregate).await;
    let brokers =
        std::env::var("OUTBOX_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let out = run(&[
        "doctor",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
        "--broker-url",
        &format!("kafka://{brokers}"),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    line(&text, "✓ broker metadata: the cluster answers");
    assert!(
        line(&text, &format!("✗ broker topic {aggregate}.Placed")).contains("missing"),
        "{text}"
    );
}

#[tokio::test]
async fn kafka_settings_librdkafka_refuses_are_named_with_its_reason() {
    let db = TestDb::new(2).await;
    let missing = std::env::temp_dir().join(unique("no-such-ca"));
    let config = config(&format!(
        "[kafka]\nsecurity_protocol = \"ssl\"\n\n[kafka.properties]\n\"ssl.ca.location\" = {:?}\n",
        missing.display().to_string()
    ));
    let out = run(&[
        "doctor",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
        "--broker-url",
        "kafka://127.0.0.1:9092",
        "--config",
        config.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&config);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let settings = line(&text, "✗ broker settings");
    assert!(
        settings.contains("cannot create the producer") && settings.contains("ssl.ca.location"),
        "the cause librdkafka gives is on the line: {text}"
    );
}

/// A SQLite URL whose file does not exist: `doctor` and `status` say so by the file's name and
/// leave no file behind (they read an outbox; only `migrate` and the relay create one); in
/// the `file:` URI form too, which opens the file once it exists.
#[test]
fn a_missing_sqlite_file_is_named_and_not_created() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("missing")));
    let url = format!("sqlite://{}", path.display());
    let out = run(&["doctor", "--database-url", &url]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let reachable = line(&text, "✗ database reachable");
    assert!(
        reachable.contains(&path.display().to_string()) && reachable.contains("does not exist"),
        "{text}"
    );
    assert!(text.contains("outbox migrate"), "{text}");
    let status = run(&["status", "--database-url", &url]);
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert_ne!(status.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(!path.exists(), "{} was created", path.display());
    // A file: URI names the same file: once `migrate` created it, the commands open it.
    let uri = format!("sqlite:file:{}", path.display());
    let migrated = run(&["migrate", "--database-url", &uri]);
    assert_eq!(
        migrated.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let status = run(&["status", "--database-url", &uri]);
    assert_eq!(
        status.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
