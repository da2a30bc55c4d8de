//! What the `outbox` binary prints (issue 41 items 8 and 9): no secret of a URL in any output
//! line, and writers' data with its control characters escaped, in the relay's log and in
//! `outbox dead-letters list`. Black-box: URLs and hostile rows go in, stdout and stderr are
//! read.

mod support;

use std::time::Duration;

use outbox_testkit::{free_port, unique, wait_until, TestDb, NATS_URL};
use support::{fast_config, http_get, run, RelayProcess};

const WAIT: Duration = Duration::from_secs(120);

/// Both streams of a finished command, as one text.
fn output_of(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn a_database_password_is_never_printed_and_errors_still_name_the_server() {
    let port = free_port();
    let server = format!("127.0.0.1:{port}");
    // A raw `/`, `@` and `:` in the password: parsers read part of it as host and port.
    let raw = format!("postgres://postgres:p/SEC@x:y@{server}/test");
    let slash_first = format!("postgres://postgres:SEC/x@{server}/test");
    for url in [&raw, &slash_first] {
        for args in [
            vec!["status", "--database-url", url],
            vec!["dead-letters", "list", "--database-url", url],
            vec!["doctor", "--database-url", url, "--broker-url", NATS_URL],
        ] {
            let text = output_of(&run(&args));
            assert!(!text.contains("SEC"), "{args:?} printed the secret: {text}");
            assert!(text.contains(&server), "{args:?} names the server: {text}");
        }
    }
    // Percent-encoded, the URL is valid: the relay waits for the server, saying so in WARN
    // lines and in /readyz.
    let encoded = format!("postgres://postgres:p%2FSEC%40x%3Ay@{server}/test");
    let config = fast_config(&unique("p"), "");
    let listen = format!("127.0.0.1:{}", free_port());
    let relay = RelayProcess::start_on(
        &["--database-url", &encoded],
        NATS_URL,
        &config,
        &listen,
        &[],
    );
    wait_until("/readyz to say what the relay waits for", WAIT, || async {
        matches!(http_get(&listen, "/readyz").await, Some((503, body)) if body.contains(&server))
    })
    .await;
    let (_, readyz) = http_get(&listen, "/readyz").await.expect("/readyz answers");
    wait_until("a WARN line about the database", WAIT, || async {
        relay.log().contains("cannot reach the database")
    })
    .await;
    for text in [readyz, relay.log()] {
        assert!(!text.contains("SEC"), "the secret in {text}");
    }
}

#[test]
fn a_broker_url_with_credentials_is_not_echoed_by_the_config_error() {
    let config = std::env::temp_dir().join(format!("{}.toml", unique("kafka")));
    std::fs::write(&config, "broker_url = \"kafka://user:kSEC@127.0.0.1:1\"\n").unwrap();
    let output = run(&[
        "relay",
        "--config",
        config.to_str().unwrap(),
        "--database-url",
        &outbox_testkit::database_url(),
        "--listen",
        "127.0.0.1:0",
    ]);
    let _ = std::fs::remove_file(&config);
    let text = output_of(&output);
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("kafka://user:***@127.0.0.1:1"), "{text}");
    assert!(!text.contains("kSEC"), "the secret in {text}");
}

#[tokio::test]
async fn an_otlp_endpoint_password_is_not_logged() {
    let db = TestDb::new(2).await;
    let prefix = unique("p");
    db.exec(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
         payload) VALUES (gen_random_uuid(), 'order', 'a1', 'Placed', '{}')",
    )
    .await;
    let config = fast_config(&prefix, "");
    let listen = format!("127.0.0.1:{}", free_port());
    // Nothing listens on the collector's port: the export fails and the relay says so.
    let endpoint = format!("http://user:oSEC@127.0.0.1:{}", free_port());
    let relay = RelayProcess::start_with_env(
        &db,
        NATS_URL,
        &config,
        &listen,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    wait_until("the export failure logged", WAIT, || async {
        relay.log().contains("did not take a batch of spans")
    })
    .await;
    let log = relay.log();
    assert!(!log.contains("oSEC"), "the secret in {log}");
    assert!(
        log.contains("user:***@127.0.0.1"),
        "the endpoint is named: {log}"
    );
}

#[tokio::test]
async fn control_characters_of_writer_data_are_escaped_in_the_log_and_the_dead_letter_list() {
    let db = TestDb::new(2).await;
    let prefix = unique("p");
    for id in ["a\nFAKE LOG LINE", "\x1b[31mred"] {
        sqlx::query(&db.tables.render(
            "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
             payload) VALUES (gen_random_uuid(), 'order', $1, 'Placed', '{}')",
        ))
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let config = fast_config(&prefix, "");
    let listen = format!("127.0.0.1:{}", free_port());
    // Control characters make the rows malformed: the relay dead-letters them, and logs it.
    let relay = RelayProcess::start(&db, NATS_URL, &config, &listen);
    wait_until("both rows dead-lettered", WAIT, || async {
        db.count("dead").await == 2 && relay.log().matches("event dead-lettered").count() >= 2
    })
    .await;
    let log = relay.log();
    assert!(!log.contains('\x1b'), "an escape byte in the log: {log:?}");
    assert!(
        !log.lines().any(|l| l.starts_with("FAKE LOG LINE")),
        "a forged log line: {log}"
    );
    assert!(log.contains(r"aggregate_id=a\nFAKE LOG LINE"), "{log}");

    let listed = run(&[
        "dead-letters",
        "list",
        "--database-url",
        &db.url,
        "--schema",
        &db.schema,
    ]);
    let text = output_of(&listed);
    assert!(listed.status.success(), "{text}");
    assert!(
        !text.contains('\x1b'),
        "an escape byte reaches the terminal: {text:?}"
    );
    assert!(!text.lines().any(|l| l.starts_with("FAKE")), "{text}");
    assert!(text.contains(r"order/a\nFAKE LOG LINE"), "{text}");
    assert!(text.contains(r"order/\x1b[31mred"), "{text}");
}
