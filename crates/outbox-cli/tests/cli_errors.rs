//! Bad input to the `outbox` command gets a clear error that names what is wrong.

mod support;

use outbox_testkit::{database_url, unique, TestDb};
use support::run;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn migrate_without_a_url_says_how_to_give_one() {
    let out = support::bin()
        .args(["migrate"])
        .env_remove("OUTBOX_DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("pass --database-url or set OUTBOX_DATABASE_URL"));
}

#[test]
fn invalid_schema_names_are_rejected_before_any_sql() {
    let out = run(&[
        "migrate",
        "--database-url",
        &database_url(),
        "--schema",
        "x; drop",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("invalid identifier \"x; drop\" for schema"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn unknown_config_keys_and_bad_values_name_the_key() {
    let path = std::env::temp_dir().join(format!("{}.toml", unique("bad")));
    for (text, expected) in [
        ("[relay]\nmax_batch_sise = 5\n", "max_batch_sise"),
        ("[relay]\nlease_ttl = \"forever\"\n", "lease_ttl"),
        (
            "[relay]\nheartbeat_interval = \"9s\"\n",
            "heartbeat_interval",
        ),
        (
            "[relay.routing]\ndefault = \"{tenant}.x\"\n",
            "routing.default",
        ),
        ("worker_threads = 0\n", "worker_threads"),
    ] {
        std::fs::write(&path, text).unwrap();
        let out = run(&[
            "relay",
            "--database-url",
            &database_url(),
            "--broker-url",
            "nats://127.0.0.1:4222",
            "--config",
            path.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ]);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(stderr(&out).contains(expected), "{text}: {}", stderr(&out));
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn unsupported_broker_schemes_and_missing_outboxes_are_explained() {
    let out = run(&[
        "relay",
        "--database-url",
        &database_url(),
        "--broker-url",
        "pulsar://127.0.0.1:6650",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert!(
        stderr(&out).contains("broker URL scheme \"pulsar\" is not supported"),
        "{}",
        stderr(&out)
    );
    let out = run(&[
        "relay",
        "--database-url",
        &database_url(),
        "--schema",
        &unique("missing"),
        "--broker-url",
        "nats://127.0.0.1:4222",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("run `outbox migrate` first"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn status_reports_backlog_and_partitions_as_json() {
    let db = TestDb::new(4).await;
    outbox_testkit::insert_sequences(&db, "order", 3, 2, 10).await;
    let out = run(&[
        "status",
        "--database-url",
        &database_url(),
        "--schema",
        &db.schema,
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["pending"], 6);
    assert_eq!(doc["dead"], 0);
    assert_eq!(doc["partitions"].as_array().unwrap().len(), 4);
    let per_partition: i64 = doc["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pending"].as_i64().unwrap())
        .sum();
    assert_eq!(per_partition, 6);
    let out = run(&[
        "status",
        "--database-url",
        &database_url(),
        "--schema",
        &db.schema,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("6 pending"), "{text}");
}

#[test]
fn unrelated_outbox_variables_are_ignored_but_misspelt_relay_keys_are_not() {
    let out = support::bin()
        .args([
            "relay",
            "--broker-url",
            "pulsar://x",
            "--database-url",
            &database_url(),
            "--listen",
            "127.0.0.1:0",
        ])
        .env("OUTBOX_SOMETHING_ELSE", "1")
        .output()
        .unwrap();
    // It gets as far as the broker scheme: the stray variable was not an error.
    assert!(
        stderr(&out).contains("scheme \"pulsar\""),
        "{}",
        stderr(&out)
    );
    let out = support::bin()
        .args([
            "relay",
            "--broker-url",
            "nats://x",
            "--database-url",
            &database_url(),
            "--listen",
            "127.0.0.1:0",
        ])
        .env("OUTBOX_RELAY__MAX_BATCH_SIZ", "5")
        .output()
        .unwrap();
    assert!(stderr(&out).contains("max_batch_siz"), "{}", stderr(&out));
}

/// A relay started before its database waits for it, retrying and saying so, instead of exiting
/// (found by the chaos suite: it needed a supervisor to come back after a PostgreSQL restart);
/// an error that waiting cannot cure, such as a missing database, still ends it at once.
#[test]
fn a_relay_waits_for_an_unreachable_database_but_not_for_a_missing_one() {
    use std::io::BufRead;
    let port = outbox_testkit::free_port();
    let mut child = support::bin()
        .args([
            "relay",
            "--database-url",
            &format!("postgres://postgres@127.0.0.1:{port}/test"),
            "--broker-url",
            "nats://127.0.0.1:4222",
            "--listen",
            "127.0.0.1:0",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the relay");
    let log = child.stderr.take().expect("piped");
    let (lines, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(log).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut waits = 0;
    while waits < 2 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx.recv_timeout(left).expect("the relay says it waits");
        // Each attempt names the address and the server's own answer.
        if line.contains("cannot reach the database")
            && line.contains(&format!("127.0.0.1:{port}"))
            && line.contains("Connection refused")
        {
            waits += 1;
        }
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "still running, waiting"
    );
    child.kill().unwrap();
    child.wait().unwrap();

    let out = run(&[
        "relay",
        "--database-url",
        &format!(
            "postgres://postgres@127.0.0.1:5432/{}",
            unique("no_such_db")
        ),
        "--broker-url",
        "nats://127.0.0.1:4222",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot connect to the database"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_database_url_of_another_kind_is_refused_with_a_sentence_that_says_so() {
    for (url, expected) in [
        (
            "mssql://sa:secret@127.0.0.1:1433/test",
            "unsupported database URL scheme \"mssql\"",
        ),
        (
            "redis://:secret@127.0.0.1:6379",
            "unsupported database URL scheme \"redis\"",
        ),
        ("127.0.0.1:5432/test", "the database URL has no scheme"),
    ] {
        for command in ["migrate", "status"] {
            let out = run(&[command, "--database-url", url]);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{command} {url}: {err}");
            assert!(err.contains(expected), "{command} {url}: {err}");
            assert!(!err.contains("secret"), "the password leaked: {err}");
        }
    }
}

#[test]
fn an_otlp_protocol_this_build_does_not_speak_is_refused_by_name() {
    for (name, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
    ] {
        let out = support::bin()
            .args(["relay", "--database-url", &database_url()])
            .args([
                "--broker-url",
                "nats://127.0.0.1:4222",
                "--listen",
                "127.0.0.1:0",
            ])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
            .env(name, value)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let text = stderr(&out);
        assert!(
            text.contains(&format!("{name}={value}")) && text.contains("http/protobuf"),
            "{text}"
        );
    }
}
