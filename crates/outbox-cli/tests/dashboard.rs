//! The dashboard: its JSON API's access rules, and the page in headless Chromium (Debian's
//! `chromium` and `chromium-driver`, installed by scripts/services.sh).

mod support;

use std::{process::Stdio, time::Duration};

use outbox_testkit::{free_port, insert_sequences, unique, wait_until, TestDb};
use support::{fast_config, http, http_get, RelayProcess};

const WAIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "t0ken-for-tests";

/// An outbox with 12 pending events and 2 dead letters (one parking its aggregate), and a relay
/// whose broker is unreachable, so the numbers hold still while the test looks at them.
async fn fixture() -> (TestDb, RelayProcess, String, std::path::PathBuf) {
    let db = TestDb::new(4).await;
    insert_sequences(&db, "order", 4, 3, 20).await;
    insert_sequences(&db, "invoice", 2, 1, 20).await;
    db.exec(
        "UPDATE {schema}.{events} SET status = 'dead', attempts = 5,
             last_error = 'permanent: rabbitmq: unroutable'
         WHERE aggregate_type = 'invoice';
         INSERT INTO {schema}.holds (aggregate_type, aggregate_id, partition, event_id, held_until)
         SELECT aggregate_type, aggregate_id, partition, id, NULL FROM {schema}.{events}
         WHERE status = 'dead' AND aggregate_id = 'a0';",
    )
    .await;
    let config = fast_config(&unique("p"), "");
    let addr = format!("127.0.0.1:{}", free_port());
    let dead_broker = format!("nats://127.0.0.1:{}", free_port());
    let relay = RelayProcess::start_with_env(
        &db,
        &dead_broker,
        &config,
        &addr,
        &[("OUTBOX_ADMIN_TOKEN", TOKEN)],
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while http_get(&addr, "/api/status")
        .await
        .is_none_or(|(s, _)| s != 200)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dashboard did not answer; relay log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (db, relay, addr, config)
}

fn dead_ids_body(id: i64) -> String {
    format!(r#"{{"ids":[{id}],"reason":"tested"}}"#)
}

#[tokio::test]
async fn the_api_reads_without_a_token_and_refuses_unauthorised_actions() {
    let (db, relay, addr, config) = fixture().await;
    let (status, body) = http_get(&addr, "/api/status").await.unwrap();
    assert_eq!(status, 200);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["pending"], 12);
    assert_eq!(doc["dead"], 2);
    assert_eq!(doc["writable"], true);
    assert!(!body.contains(TOKEN), "no secret in the API");
    let (status, body) = http_get(&addr, "/api/dead-letters").await.unwrap();
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = list[0]["id"].as_i64().unwrap();
    let json = ("content-type", "application/json");
    let body = dead_ids_body(id);
    let (status, _) = http(&addr, "POST", "/api/dead-letters/replay", &[json], &body)
        .await
        .unwrap();
    assert_eq!(status, 401, "no token");
    let wrong = ("authorization", "Bearer nope");
    let (status, _) = http(
        &addr,
        "POST",
        "/api/dead-letters/replay",
        &[json, wrong],
        &body,
    )
    .await
    .unwrap();
    assert_eq!(status, 401, "wrong token");
    let auth = format!("Bearer {TOKEN}");
    let good = ("authorization", auth.as_str());
    let evil = ("origin", "http://evil.example");
    let (status, _) = http(
        &addr,
        "POST",
        "/api/dead-letters/replay",
        &[json, good, evil],
        &body,
    )
    .await
    .unwrap();
    assert_eq!(status, 403, "cross-origin");
    let (status, reply) = http(
        &addr,
        "POST",
        "/api/dead-letters/skip",
        &[json, good],
        r#"{"ids":[1],"reason":" "}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, 400, "{reply}");
    let (status, _) = http(
        &addr,
        "POST",
        "/api/dead-letters/replay",
        &[json, good],
        "{not json",
    )
    .await
    .unwrap();
    assert_eq!(status, 400);
    assert_eq!(db.count("dead").await, 2, "nothing changed so far");
    let (status, reply) = http(
        &addr,
        "POST",
        "/api/dead-letters/replay",
        &[json, good],
        &body,
    )
    .await
    .unwrap();
    assert_eq!(
        (status, reply.as_str()),
        (200, r#"{"not_replayed":[],"replayed":1}"#)
    );
    assert_eq!(db.count("dead").await, 1);
    drop(relay);
    let _ = std::fs::remove_file(config);
}

/// Polls `addr` until `path` answers 200; panics with the relay's log at the deadline.
async fn wait_for_200(relay: &RelayProcess, addr: &str, path: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while http_get(addr, path).await.is_none_or(|(s, _)| s != 200) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{addr}{path} did not answer 200; relay log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_metrics_listener_of_its_own_serves_probes_and_scrapes_and_not_the_api() {
    let db = TestDb::new(2).await;
    let config = fast_config(&unique("p"), "");
    let addr = format!("127.0.0.1:{}", free_port());
    let probes = format!("127.0.0.1:{}", free_port());
    let dead_broker = format!("nats://127.0.0.1:{}", free_port());
    let relay = RelayProcess::start_with_env(
        &db,
        &dead_broker,
        &config,
        &addr,
        &[("OUTBOX_METRICS_LISTEN", probes.as_str())],
    );
    wait_for_200(&relay, &probes, "/metrics").await;
    wait_for_200(&relay, &addr, "/api/status").await;
    let (_, text) = http_get(&probes, "/metrics").await.unwrap();
    assert!(text.contains("outbox_"), "{text}");
    assert_eq!(http_get(&probes, "/healthz").await.unwrap().0, 200);
    let (status, reason) = http_get(&probes, "/readyz").await.unwrap();
    assert!(status == 200 || status == 503, "{status} {reason}");
    for path in ["/", "/api/status", "/api/dead-letters"] {
        assert_eq!(http_get(&probes, path).await.unwrap().0, 404, "{path}");
    }
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(http_get(&addr, path).await.unwrap().0, 404, "{path}");
    }
    drop(relay);
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn a_relay_listening_beyond_loopback_without_a_token_refuses_reads() {
    let db = TestDb::new(2).await;
    let config = fast_config(&unique("p"), "");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let dead_broker = format!("nats://127.0.0.1:{}", free_port());
    let relay = RelayProcess::start(&db, &dead_broker, &config, &format!("0.0.0.0:{port}"));
    wait_for_200(&relay, &addr, "/metrics").await;
    for path in ["/api/status", "/api/dead-letters"] {
        let (status, body) = http_get(&addr, path).await.unwrap();
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("read_token"), "{body}");
    }
    assert_eq!(http_get(&addr, "/healthz").await.unwrap().0, 200);
    drop(relay);
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn in_chromium_the_page_shows_the_backlog_and_replays_a_dead_letter() {
    let (db, relay, addr, config) = fixture().await;
    let driver_port = free_port();
    let mut driver = std::process::Command::new("chromedriver")
        .arg(format!("--port={driver_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver (Debian package chromium-driver) must be installed: scripts/services.sh installs it");
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--no-first-run", "--window-size=1280,900",
                     format!("--user-data-dir={}", std::env::temp_dir().join(unique("chrome")).display())],
        }),
    );
    // chromedriver takes a moment to listen: retry the session until a deadline.
    let url = format!("http://127.0.0.1:{driver_port}");
    let deadline = tokio::time::Instant::now() + WAIT;
    let client = loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match fantoccini::ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(client) => break client,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("no WebDriver session: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    client.goto(&format!("http://{addr}/")).await.unwrap();
    let pending = db.count("pending").await.to_string();
    wait_until("the page to show the database's backlog", WAIT, || async {
        let text = client
            .find(fantoccini::Locator::Id("pending"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text == pending
    })
    .await;
    assert_eq!(
        client
            .find(fantoccini::Locator::Id("dead"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "2"
    );
    // The stylesheet loads under the Content-Security-Policy (the script does: the numbers
    // above are its work).
    let header_color = client
        .execute(
            "return getComputedStyle(document.querySelector('header')).backgroundColor",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(header_color, serde_json::json!("rgb(29, 36, 51)"));
    // A second refresh draws the chart and the rate: then the screenshot shows them.
    wait_until("a second refresh", WAIT, || async {
        client
            .find(fantoccini::Locator::Id("rate"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            != "–"
    })
    .await;
    let png = client.screenshot().await.unwrap();
    let shot = std::env::temp_dir().join(format!("{}.png", unique("dashboard")));
    std::fs::write(&shot, &png).unwrap();
    if std::env::var_os("OUTBOX_UPDATE_SCREENSHOT").is_some() {
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/dashboard.png"),
            &png,
        )
        .unwrap();
    }
    assert!(png.starts_with(b"\x89PNG"));

    // Replay the parked invoice's dead letter through the page.
    client
        .find(fantoccini::Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    client
        .find(fantoccini::Locator::Id("reason"))
        .await
        .unwrap()
        .send_keys("fixed in the browser")
        .await
        .unwrap();
    let first_id: i64 = sqlx::query_scalar(
        &db.tables
            .render("SELECT min(id) FROM {schema}.{events} WHERE status = 'dead'"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let button = format!("tr[data-id=\"{first_id}\"] button.replay");
    // The page redraws its table every few seconds: a button found just before a redraw is
    // gone when clicked (a stale element), so it is found again until a click lands.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let clicked = match client.find(fantoccini::Locator::Css(&button)).await {
            Ok(element) => element.click().await,
            Err(e) => Err(e),
        };
        match clicked {
            Ok(_) => break,
            Err(e) if std::time::Instant::now() < deadline && is_stale(&e) => continue,
            Err(e) => panic!("clicking replay: {e}"),
        }
    }
    wait_until("the replay to reach the database", WAIT, || async {
        db.count("dead").await == 1
    })
    .await;
    let audit: String = sqlx::query_scalar(
        &db.tables
            .render("SELECT actor || ': ' || reason FROM {schema}.audit ORDER BY id DESC LIMIT 1"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(audit, "dashboard: fixed in the browser");
    wait_until("the page to show one dead letter", WAIT, || async {
        client
            .find(fantoccini::Locator::Id("dead"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            == "1"
    })
    .await;
    client.close().await.unwrap();
    let _ = driver.kill();
    let _ = driver.wait();
    drop(relay);
    let _ = std::fs::remove_file(config);
    let _ = std::fs::remove_file(shot);
}

/// Whether a WebDriver error says the element was replaced since it was found.
fn is_stale(error: &fantoccini::error::CmdError) -> bool {
    matches!(
        error,
        fantoccini::error::CmdError::Standard(e)
            if e.error == fantoccini::error::ErrorStatus::StaleElementReference
    )
}
