//! Writer data in metric labels: a destination cannot forge a label or break the exposition
//! (issue 41 item 6). Rows go in by SQL, the relay runs as a process, `/metrics` is read as a
//! scraper reads it.

mod support;

use std::time::Duration;

use outbox_testkit::{free_port, unique, wait_until, TestDb, NATS_URL};
use support::{fast_config, http_get, RelayProcess};

const WAIT: Duration = Duration::from_secs(120);

/// The label pairs of one sample line, read with the exposition format's escapes (`\\`, `\"`,
/// `\n`); `Err` names what a scraper would refuse.
fn labels(line: &str) -> Result<Vec<(String, String)>, String> {
    let Some(open) = line.find('{') else {
        return Ok(Vec::new());
    };
    let mut rest = line[open + 1..].chars();
    let mut out = Vec::new();
    loop {
        let name: String = rest.by_ref().take_while(|c| *c != '=').collect();
        if rest.next() != Some('"') {
            return Err(format!("no quoted value after {name} in {line}"));
        }
        let mut value = String::new();
        loop {
            match rest.next() {
                Some('\\') => match rest.next() {
                    Some('n') => value.push('\n'),
                    Some(c @ ('\\' | '"')) => value.push(c),
                    other => return Err(format!("escape {other:?} in {line}")),
                },
                Some('"') => break,
                Some(c) => value.push(c),
                None => return Err(format!("unclosed value in {line}")),
            }
        }
        out.push((name, value));
        match rest.next() {
            Some(',') => {}
            Some('}') => return Ok(out),
            other => return Err(format!("{other:?} after a label value in {line}")),
        }
    }
}

#[tokio::test]
async fn hostile_destinations_stay_inside_their_label() {
    let db = TestDb::new(2).await;
    let prefix = unique("p");
    let hostile = [
        format!("{prefix}.inj\",relay_id=\"forged"),
        format!("{prefix}.lone\"quote"),
        format!("{prefix}.back\\slash"),
    ];
    // A line feed is refused when the row is decoded (no broker can carry it): its attempts
    // are counted under `(undecodable)`, and its text must not reach the exposition either.
    let line_feed = format!("{prefix}.line\nfeed outbox_ready 0");
    for (i, destination) in hostile.iter().chain([&line_feed]).enumerate() {
        sqlx::query(&db.tables.render(
            "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, event_type, \
             destination, payload) VALUES (gen_random_uuid(), 'order', $1, 'Placed', $2, '{}')",
        ))
        .bind(format!("a{i}"))
        .bind(destination)
        .execute(&db.pool)
        .await
        .expect("insert a row with a hostile destination");
    }
    let config = fast_config(&prefix, "");
    let addr = format!("127.0.0.1:{}", free_port());
    // The three are legal NATS subjects under the test's stream: each is counted under its
    // destination, as published (or as a failure, should a broker refuse it).
    let _relay = RelayProcess::start(&db, NATS_URL, &config, &addr);
    wait_until("every hostile destination counted", WAIT, || async {
        let Some((200, body)) = http_get(&addr, "/metrics").await else {
            return false;
        };
        body.contains("destination=\"(undecodable)\"")
            && hostile.iter().all(|d| {
                body.lines().any(|line| {
                    (line.starts_with("outbox_failed_total{")
                        || line.starts_with("outbox_published_total{"))
                        && labels(line).is_ok_and(|l| l.iter().any(|(_, v)| v == d))
                })
            })
    })
    .await;
    let (_, body) = http_get(&addr, "/metrics").await.expect("a scrape");
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let pairs = labels(line).unwrap_or_else(|e| panic!("an invalid exposition: {e}"));
        assert!(
            pairs.iter().all(|(name, _)| name != "relay_id"),
            "a forged label in {line}"
        );
        let value = line.rsplit(' ').next().unwrap_or_default();
        assert!(
            value.parse::<f64>().is_ok(),
            "a sample line without a value: {line}"
        );
    }
    assert!(
        !body.lines().any(|l| l.starts_with("feed ")),
        "a forged sample line"
    );
}
