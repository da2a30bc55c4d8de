//! `outbox healthcheck` against a real `outbox relay` on SQLite, a port nobody listens on, and
//! a server that never answers: exit 0 on a 2xx, 1 on anything else, one line saying why.

mod support;

use std::{process::Output, time::Duration};

use outbox_testkit::{free_port, unique};
use support::RelayProcess;

/// Runs `outbox healthcheck args…` off the test's runtime (it blocks until the child exits).
async fn healthcheck(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = support::bin();
    command.arg("healthcheck").args(args);
    command.env_remove("OUTBOX_HEALTHCHECK_URL");
    command.envs(env.iter().copied());
    tokio::task::spawn_blocking(move || command.output().expect("run outbox healthcheck"))
        .await
        .expect("the child's waiter")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A migrated SQLite outbox in the temp dir; returns its URL and file path.
fn migrated_sqlite() -> (String, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("{}.db", unique("health")));
    let url = format!("sqlite://{}", path.display());
    let out = support::run(&["migrate", "--database-url", &url]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    (url, path)
}

fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test]
async fn a_running_relay_is_healthy_and_its_503_readiness_is_not() {
    let (url, path) = migrated_sqlite();
    let config = support::fast_config(&unique("p"), "");
    let listen = format!("127.0.0.1:{}", free_port());
    // A broker nobody listens on: the relay runs and serves /healthz, and /readyz answers 503
    // ("broker unreachable") for as long as the broker cannot be reached.
    let dead_broker = format!("nats://127.0.0.1:{}", free_port());
    let mut relay = RelayProcess::start_on(
        &["--database-url", &url],
        &dead_broker,
        &config,
        &listen,
        &[],
    );
    let healthz = format!("http://{listen}/healthz");
    // Polled until the relay serves, with a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let out = loop {
        let out = healthcheck(&["--url", &healthz], &[]).await;
        if out.status.success() || std::time::Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out.stderr),
        relay.log()
    );
    assert_eq!(
        text(&out.stdout),
        format!("healthy: 200 OK from {healthz}\n")
    );
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));

    // The URL also comes from the environment (how an image would point it elsewhere).
    let out = healthcheck(&[], &[("OUTBOX_HEALTHCHECK_URL", &healthz)]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // /readyz of a relay whose broker is down: 503 and exit 1 throughout (first while the
    // relay starts, then because the broker cannot be reached), the relay's reason quoted.
    let readyz = format!("http://{listen}/readyz");
    let prefix = format!("unhealthy: 503 Service Unavailable from {readyz}: not ready: ");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = healthcheck(&["--url", &readyz], &[]).await;
        let line = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{line}");
        assert!(line.starts_with(&prefix), "{line}");
        assert_eq!(line.lines().count(), 1, "one line: {line}");
        assert!(out.stdout.is_empty());
        if line.starts_with(&format!("{prefix}broker unreachable")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the relay never said its broker is unreachable: {line}\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    assert!(relay.terminate(), "{}", relay.log());
    remove_sqlite(&path);
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn a_port_nobody_listens_on_is_unhealthy() {
    let url = format!("http://127.0.0.1:{}/healthz", free_port());
    let out = healthcheck(&["--url", &url], &[]).await;
    assert_eq!(out.status.code(), Some(1));
    let line = text(&out.stderr);
    assert!(
        line.starts_with(&format!("unhealthy: cannot GET {url}: ")) && line.contains("refused"),
        "{line}"
    );
    assert_eq!(line.lines().count(), 1, "one line: {line}");
}

#[tokio::test]
async fn a_server_that_never_answers_is_unhealthy_after_the_timeout() {
    // Accepts connections (the kernel completes the handshake) and never reads or writes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/healthz", silent.local_addr().unwrap());
    let started = std::time::Instant::now();
    let out = healthcheck(&["--url", &url, "--timeout", "300ms"], &[]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!("unhealthy: no answer from {url} within 300ms\n")
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the timeout bounds the check: {:?}",
        started.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn a_url_that_is_not_plain_http_is_unhealthy_not_an_error() {
    for url in [
        "https://127.0.0.1:9187/healthz",
        "127.0.0.1:9187",
        "http://",
    ] {
        let out = healthcheck(&["--url", url], &[]).await;
        // 2 would be "reserved" to a container HEALTHCHECK: a bad URL is unhealthy (1).
        assert_eq!(out.status.code(), Some(1), "{url}");
        let line = text(&out.stderr);
        assert!(line.starts_with("unhealthy: invalid URL"), "{url}: {line}");
    }
}
