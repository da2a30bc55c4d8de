//! Rows written by plain SQL, as any language may write them, with arbitrary (type-valid)
//! column content, through the real relay and real PostgreSQL (G8): every row the database
//! accepts ends `published` (body and headers unchanged) or `dead` with a `last_error` that
//! names the problem, or waits behind a dead head of its own aggregate (parked, G4); nothing
//! stays pending otherwise, other aggregates are not held up, and the relay does not panic.
//! Values are written as SQL text (headers as jsonb text), so that they hold what a Rust type
//! cannot: numbers out of f64's range, nesting deeper than a JSON parser goes, megabytes.

mod common;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;
use outbox_relayer::{
    publishers::nats::is_valid_subject, routing::RoutingConfig, Message, PublishError, Publisher,
};
use outbox_testkit::{unique, NatsReader, TestDb, NATS_URL};
use proptest::{prelude::*, test_runner::TestRunner};
use serde_json::Value;
use sqlx::Row;
use uuid::Uuid;

/// The relay loads no payload over this many bytes.
const MAX_PAYLOAD: usize = 64 * 1024;
const SETTLE: Duration = Duration::from_secs(20);

/// Accepts everything a NATS subject may be and records it, as a broker that acknowledges.
#[derive(Default)]
struct Recorder(Mutex<Vec<Message>>);

impl Publisher for Recorder {
    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        self.0.lock().unwrap().push(message.clone());
        Box::pin(async { Ok(()) })
    }
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn max_payload_bytes(&self) -> usize {
        1024 * 1024
    }
    fn check_destination(&self, destination: &str) -> Result<(), PublishError> {
        if is_valid_subject(destination) {
            Ok(())
        } else {
            let start: String = destination.chars().take(40).collect();
            Err(PublishError::permanent(format!(
                "{start:?}… is not a valid subject"
            )))
        }
    }
}

/// Text PostgreSQL accepts (no NUL): well-formed, blank, control characters, wildcards,
/// any printable Unicode, or long enough to overflow an index entry.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => "[A-Za-z0-9_-]{1,10}",
        1 => Just(String::new()),
        1 => "[ \t]{1,3}",
        1 => "[a-z]{0,2}[\r\n\u{1}\u{1b}\u{7f}\u{85}][a-z]{0,2}",
        1 => "[a-z]{0,3}[.*> ][a-z]{0,3}",
        1 => "[^\u{0}]{1,12}",
        // Over PostgreSQL's index entry limit (random, so incompressible): refused at insert.
        1 => "[!-~]{3000,3500}",
    ]
}

/// JSON PostgreSQL's jsonb accepts (no NUL in strings), of any shape.
fn json_value() -> impl Strategy<Value = Value> {
    let string = "[^\u{0}]{0,8}";
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        string.prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 12, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(string, inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// The `headers` column as jsonb text: mostly an object of strings; any JSON; and what only
/// text can carry: numbers beyond f64 (valid jsonb, refused by a JSON parser), nesting deeper
/// than 128 levels, values over the relay's 64 KiB limit (random, so incompressible).
fn headers() -> impl Strategy<Value = String> {
    let value = prop_oneof![4 => "[ -~]{0,16}", 1 => "[^\u{0}]{0,8}"];
    prop_oneof![
        8 => prop::collection::btree_map("[A-Za-z0-9._-]{1,12}", value, 0..4)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k, Value::String(v))).collect()).to_string()),
        2 => json_value().prop_map(|v| v.to_string()),
        1 => prop::sample::select(vec!["1e400", "-1e400", "1e-400", "123456789012345678901234567890"])
            .prop_map(|n| format!(r#"{{"n": {n}}}"#)),
        1 => (129..600usize).prop_map(|depth| {
            format!(r#"{{"deep": {}1{}}}"#, "[".repeat(depth), "]".repeat(depth))
        }),
        1 => "[!-~&&[^\"\\\\]]{70000,72000}".prop_map(|v| format!(r#"{{"big": "{v}"}}"#)),
    ]
}

/// Text columns the relay does not load whole: over 4 KiB (random, so incompressible).
fn long_text() -> impl Strategy<Value = String> {
    "[!-~]{4097,6000}"
}

/// One row as another language might INSERT it.
#[derive(Clone)]
struct SqlRow {
    aggregate_type: String,
    aggregate_id: String,
    aggregate_version: Option<i64>,
    event_type: String,
    schema_version: i32,
    destination: Option<String>,
    payload: Vec<u8>,
    content_type: String,
    /// jsonb text.
    headers: String,
    /// `occurred_at` as SQL text, or the column default.
    occurred_at: Option<&'static str>,
}

/// Times PostgreSQL accepts, some of which the relay cannot represent.
const OCCURRED_AT: &[&str] = &[
    "infinity",
    "-infinity",
    "294276-12-31 23:59:59+00",
    "10000-01-01 00:00:00+00",
    "4713-11-24 00:00:00+00 BC",
    "2024-02-29 12:00:00.123456+05:30",
];

/// Those it cannot: the row is dead-lettered, naming `occurred_at`.
fn unrepresentable(occurred_at: &str) -> bool {
    occurred_at.ends_with("infinity") || occurred_at.starts_with("294276")
}

prop_compose! {
    fn sql_row()(
        (aggregate_type, aggregate_id, aggregate_version) in
            (text(), text(), prop_oneof![3 => Just(None), 1 => any::<Option<i64>>()]),
        (event_type, schema_version, destination) in (
            prop_oneof![12 => text(), 1 => long_text()],
            prop_oneof![6 => 1..4i32, 1 => any::<i32>()],
            prop_oneof![8 => Just(None), 2 => prop::option::of(text()), 1 => long_text().prop_map(Some)],
        ),
        payload in prop_oneof![
            6 => prop::collection::vec(any::<u8>(), 0..64),
            1 => (MAX_PAYLOAD - 1..MAX_PAYLOAD + 2).prop_map(|n| vec![0xA5; n]),
            1 => Just(vec![0x5A; 2 * 1024 * 1024]),
        ],
        (content_type, headers) in (prop_oneof![12 => text(), 1 => long_text()], headers()),
        occurred_at in prop_oneof![6 => Just(None), 1 => prop::sample::select(OCCURRED_AT).prop_map(Some)],
    ) -> SqlRow {
        SqlRow {
            aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
            destination, payload, content_type, headers, occurred_at,
        }
    }
}

/// Why the relay must refuse this row (a word its `last_error` contains), if it must.
fn fault(row: &SqlRow, routing: &RoutingConfig) -> Option<&'static str> {
    let printable = |s: &str| !s.trim().is_empty() && !s.chars().any(char::is_control);
    // Columns over their size limit are not loaded (in this order); the random text the
    // strategies use for them does not compress, so stored size is about text size.
    let over = |s: &str| s.len() > 4096;
    if over(&row.event_type) {
        return Some("event_type is");
    }
    if row.destination.as_deref().is_some_and(over) {
        return Some("destination is");
    }
    if over(&row.content_type) {
        return Some("content_type is");
    }
    if row.headers.len() > 65536 {
        return Some("headers are");
    }
    let parsed: Option<Value> = serde_json::from_str(&row.headers).ok();
    let headers_ok = parsed.as_ref().and_then(Value::as_object).is_some_and(|m| {
        m.iter().all(|(k, v)| {
            !k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && v.as_str().is_some_and(|v| !v.contains(['\r', '\n']))
        })
    });
    if row.payload.len() > MAX_PAYLOAD {
        Some("payload")
    } else if !headers_ok {
        Some("header")
    } else if !printable(&row.content_type) {
        Some("content_type")
    } else if !printable(&row.aggregate_type) {
        Some("aggregate_type")
    } else if !printable(&row.aggregate_id) {
        Some("aggregate_id")
    } else if !printable(&row.event_type) {
        Some("event_type")
    } else if row.destination.as_deref().is_some_and(|d| !printable(d)) {
        Some("destination")
    } else if row.occurred_at.is_some_and(unrepresentable) {
        Some("occurred_at")
    } else {
        let routed = routing.route(
            row.destination.as_deref(),
            &row.aggregate_type,
            &row.event_type,
            row.schema_version,
        );
        (!is_valid_subject(&routed)).then_some("not a valid subject")
    }
}

impl std::fmt::Debug for SqlRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&describe(self))
    }
}

/// A short description of a row for assertion messages (columns can be megabytes).
fn describe(row: &SqlRow) -> String {
    let cut = |s: &str| format!("{:?}", s.chars().take(40).collect::<String>());
    format!(
        "type {} id {} v{:?} event {} schema {} dest {:?} payload {}B ct {} headers {:.80} at {:?}",
        cut(&row.aggregate_type),
        cut(&row.aggregate_id),
        row.aggregate_version,
        cut(&row.event_type),
        row.schema_version,
        row.destination.as_deref().map(cut),
        row.payload.len(),
        cut(&row.content_type),
        row.headers,
        row.occurred_at,
    )
}

/// Inserts `row` by plain SQL; `None` when the database refuses it (a CHECK constraint, an
/// index entry over PostgreSQL's size limit): the writer's transaction fails, nothing is lost.
async fn insert(db: &TestDb, row: &SqlRow) -> Option<i64> {
    let sql = db.tables.render(
        "INSERT INTO {schema}.{events} (event_id, aggregate_type, aggregate_id, \
         aggregate_version, event_type, schema_version, destination, payload, content_type, \
         headers, occurred_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::jsonb, \
         coalesce($11::timestamptz, clock_timestamp())) RETURNING id",
    );
    let result = sqlx::query_scalar(&sql)
        .bind(Uuid::now_v7())
        .bind(&row.aggregate_type)
        .bind(&row.aggregate_id)
        .bind(row.aggregate_version)
        .bind(&row.event_type)
        .bind(row.schema_version)
        .bind(&row.destination)
        .bind(&row.payload)
        .bind(&row.content_type)
        .bind(&row.headers)
        .bind(row.occurred_at)
        .fetch_one(&db.pool)
        .await;
    match result {
        Ok(id) => Some(id),
        Err(e) => {
            let code = e
                .as_database_error()
                .and_then(|d| d.code())
                .unwrap_or_default();
            // 23xxx: integrity constraint; 22xxx: jsonb text PostgreSQL refuses (a lone
            // surrogate, nesting past its own limit); 54000: index row too large.
            assert!(
                code.starts_with("23") || code.starts_with("22") || code == "54000",
                "{e} for {}",
                describe(row)
            );
            None
        }
    }
}

/// Pending rows that are not parked behind a dead head of their aggregate.
async fn unsettled(db: &TestDb) -> i64 {
    let sql = db.tables.render(
        "SELECT count(*) FROM {schema}.{events} e WHERE e.status = 'pending' AND NOT EXISTS (
             SELECT 1 FROM {schema}.holds h WHERE h.held_until IS NULL
               AND h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id)",
    );
    sqlx::query_scalar(&sql).fetch_one(&db.pool).await.unwrap()
}

/// The unsettled rows, described, for the failure message.
async fn unsettled_rows(db: &TestDb, inserted: &[(i64, SqlRow)]) -> String {
    let sql = db
        .tables
        .render("SELECT id, attempts, last_error FROM {schema}.{events} WHERE status = 'pending'");
    let rows = sqlx::query(&sql).fetch_all(&db.pool).await.unwrap();
    rows.iter()
        .map(|r| {
            let id: i64 = r.get("id");
            let row = inserted
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, row)| describe(row));
            let attempts: i32 = r.get("attempts");
            let error: Option<String> = r.get("last_error");
            format!("  row {id} ({attempts} attempts, {error:?}): {row:?}\n")
        })
        .collect()
}

/// Inserts `hostile` rows mixed with well-formed bystander aggregates, runs the relay until
/// every row is settled, and checks each row's fate against what the column contract says.
async fn check(hostile: Vec<SqlRow>) {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let mut config = common::fast_config(&db, &prefix);
    config.max_payload_bytes = Some(MAX_PAYLOAD);
    let mut rows = Vec::new();
    for (i, row) in hostile.into_iter().enumerate() {
        for b in 0..2 {
            let bystander = SqlRow {
                aggregate_type: "bystander".into(),
                aggregate_id: format!("b{}", (i + b) % 5),
                aggregate_version: None,
                event_type: "Happened".into(),
                schema_version: 1,
                destination: None,
                payload: format!("{i}/{b}").into_bytes(),
                content_type: "text/plain".into(),
                headers: serde_json::json!({ "n": i.to_string() }).to_string(),
                occurred_at: None,
            };
            rows.push(bystander);
        }
        rows.push(row.clone());
        // A well-formed follower in the same aggregate: published after a good head, parked
        // behind a dead one.
        rows.push(SqlRow {
            payload: b"follower".to_vec(),
            headers: "{}".into(),
            event_type: "Followed".into(),
            destination: None,
            content_type: "text/plain".into(),
            aggregate_version: None,
            occurred_at: None,
            ..row
        });
    }
    let mut inserted = Vec::new();
    for row in rows {
        if let Some(id) = insert(&db, &row).await {
            inserted.push((id, row));
        }
    }
    let recorder = Arc::new(Recorder::default());
    let relay = common::start(&db, recorder.clone(), config.clone()).await;
    let deadline = tokio::time::Instant::now() + SETTLE;
    while unsettled(&db).await > 0 {
        if tokio::time::Instant::now() > deadline {
            panic!(
                "rows neither published, dead nor parked after {SETTLE:?}:\n{}",
                unsettled_rows(&db, &inserted).await
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.shutdown().await.expect("the relay stops cleanly");

    let state_sql = db
        .tables
        .render("SELECT id, status, last_error, attempts FROM {schema}.{events} ORDER BY id");
    let state: HashMap<i64, (String, Option<String>)> = sqlx::query(&state_sql)
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("id"), (r.get("status"), r.get("last_error"))))
        .collect();
    let published: HashMap<i64, Message> = recorder
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|m| (m.id, m.clone()))
        .collect();
    // The model, in id order: an aggregate publishes until its first bad row, which is dead;
    // its later rows wait (parked).
    let mut dead_aggregates = std::collections::HashSet::new();
    for (id, row) in &inserted {
        let key = (row.aggregate_type.clone(), row.aggregate_id.clone());
        let (status, last_error) = &state[id];
        let context = || format!("row {id} {}: {status} {last_error:?}", describe(row));
        if dead_aggregates.contains(&key) {
            assert_eq!(
                status,
                "pending",
                "parked behind its dead head: {}",
                context()
            );
            continue;
        }
        match fault(row, &config.routing) {
            None => {
                assert_eq!(status, "published", "{}", context());
                let m = &published[id];
                assert_eq!(
                    &m.payload[..],
                    &row.payload[..],
                    "body unchanged: {}",
                    context()
                );
                let headers: BTreeMap<String, String> = serde_json::from_str(&row.headers).unwrap();
                assert_eq!(m.headers, headers, "{}", context());
                assert_eq!(
                    (&m.aggregate_type, &m.aggregate_id, &m.event_type),
                    (&row.aggregate_type, &row.aggregate_id, &row.event_type)
                );
            }
            Some(word) => {
                dead_aggregates.insert(key);
                assert_eq!(status, "dead", "{}", context());
                let error = last_error.as_deref().unwrap_or_default();
                assert!(error.starts_with("permanent: "), "{}", context());
                assert!(
                    error.contains(word),
                    "last_error should name {word:?}: {}",
                    context()
                );
                assert!(error.len() < 1000, "last_error stays short: {}", context());
                assert!(!published.contains_key(id), "{}", context());
            }
        }
    }
    let bystanders = inserted
        .iter()
        .filter(|(_, r)| r.aggregate_type == "bystander")
        .count();
    assert!(bystanders >= 2, "bystanders were written");
}

#[test]
fn rows_with_any_column_content_end_published_dead_or_parked() {
    // Each case runs the relay against its own schema: few cases, many rows each.
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 4,
        max_shrink_iters: 0,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    runner
        .run(&prop::collection::vec(sql_row(), 12..20), |hostile| {
            rt.block_on(check(hostile));
            Ok(())
        })
        .unwrap();
}

/// Odd but well-formed content goes through the real NATS server unchanged: Unicode keys,
/// control characters other than CR and LF in header values, binary payloads, extreme
/// versions and times.
#[tokio::test]
async fn odd_but_valid_rows_reach_nats_unchanged() {
    let db = TestDb::new(2).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let base = SqlRow {
        aggregate_type: "order".into(),
        aggregate_id: "ü-汉字-😀".into(),
        aggregate_version: Some(i64::MAX),
        event_type: "Placed".into(),
        schema_version: i32::MAX,
        destination: None,
        payload: (0..=255u8).chain(*b"\r\n\0").collect(),
        content_type: "application/octet-stream; x=\"ä\"".into(),
        headers: serde_json::json!({
            "note": "café ☕ {event_type}",
            // Inside the value: NATS (like HTTP) trims whitespace around a header value,
            // Unicode whitespace such as U+0085 included (docs/fuzzing.md).
            "ctl": "a\u{1}b\tc\u{7f}d\u{85}e",
            "event-id": "forged",
            "empty": "",
        })
        .to_string(),
        occurred_at: Some("10000-01-01 00:00:00+00"),
    };
    let rows = [
        base.clone(),
        SqlRow {
            aggregate_id: "x".repeat(2000),
            aggregate_version: None,
            event_type: "{schema_version}".into(),
            occurred_at: Some("4713-11-24 00:00:00+00 BC"),
            ..base.clone()
        },
        SqlRow {
            destination: Some(format!("{prefix}.override.ü")),
            payload: Vec::new(),
            headers: "{}".into(),
            ..base.clone()
        },
    ];
    let mut ids = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let row = SqlRow {
            aggregate_id: format!("{}{i}", row.aggregate_id),
            ..row.clone()
        };
        ids.push(
            insert(&db, &row)
                .await
                .expect("a well-formed row is accepted"),
        );
    }
    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    let got = reader.wait_for(rows.len(), SETTLE).await;
    relay.shutdown().await.expect("the relay stops cleanly");
    assert_eq!(db.count("published").await, rows.len() as i64);
    for (i, row) in rows.iter().enumerate() {
        let id = format!("{}{i}", row.aggregate_id);
        let d = got
            .iter()
            .find(|d| d.aggregate_id == id)
            .unwrap_or_else(|| panic!("row {i} not delivered: {got:?}"));
        assert_eq!(d.payload, row.payload, "row {i}: body unchanged");
        let headers: Value = serde_json::from_str(&row.headers).unwrap();
        for (name, value) in headers.as_object().unwrap() {
            if name != "event-id" {
                assert_eq!(
                    d.headers.get(name),
                    value.as_str().map(str::to_owned).as_ref()
                );
            }
        }
        assert_ne!(d.headers["event-id"], "forged", "the relay's event id wins");
        assert_eq!(d.headers["content-type"], row.content_type);
        assert_eq!(d.headers["event-type"], row.event_type);
        assert_eq!(d.headers["schema-version"], i32::MAX.to_string());
        let expected_destination = row
            .destination
            .clone()
            .unwrap_or(format!("{prefix}.order.{}", row.event_type));
        assert_eq!(
            d.destination, expected_destination,
            "routed once, literally"
        );
    }
    assert!(got[0].headers["occurred-at"].starts_with("+10000-01-01T00:00:00"));
    let _ = ids;
    reader.cleanup().await;
}

/// An aggregate key that does not fit in a btree entry (about 2.7 kB after compression) is
/// refused when written, by the pending-rows-by-aggregate index: the writer's transaction
/// fails. Before that index (migration 0006) such a row was accepted, and when it failed the
/// relay could not record it (`holds` and the dead-letter index refuse the key), retried the
/// batch's outcomes forever and stalled the partition (docs/fuzzing.md).
#[tokio::test]
async fn an_aggregate_key_over_the_index_limit_is_refused_when_written() {
    let db = TestDb::new(1).await;
    let key: String = sqlx::query_scalar(
        "SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 100)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let row = SqlRow {
        aggregate_type: "order".into(),
        aggregate_id: key,
        aggregate_version: None,
        event_type: "Placed".into(),
        schema_version: 1,
        destination: None,
        payload: b"{}".to_vec(),
        content_type: String::new(),
        headers: "{}".into(),
        occurred_at: None,
    };
    assert_eq!(insert(&db, &row).await, None, "refused by the database");
    assert_eq!(db.count("pending").await, 0);
}

/// What reads `occurred_at` besides the claim: the lag gauge, `outbox status` and the
/// dead-letter list used to panic decoding a row written with `-infinity` or `infinity`; the
/// lag now counts from the row's arrival, whatever its `occurred_at`.
#[tokio::test]
async fn infinite_times_do_not_break_the_gauges_or_the_dead_letter_list() {
    let db = TestDb::new(2).await;
    let row = |at: &'static str| SqlRow {
        aggregate_type: "order".into(),
        aggregate_id: at.into(),
        aggregate_version: None,
        event_type: "Placed".into(),
        schema_version: 1,
        destination: None,
        payload: b"{}".to_vec(),
        content_type: "application/json".into(),
        headers: "{}".into(),
        occurred_at: Some(at),
    };
    let pending = insert(&db, &row("-infinity")).await.unwrap();
    let dead = insert(&db, &row("infinity")).await.unwrap();
    db.exec(&format!(
        "UPDATE {{schema}}.{{events}} SET status = 'dead' WHERE id = {dead}"
    ))
    .await;
    let store = outbox_relayer::postgres::PgStore::open(db.pool.clone(), &db.tables)
        .await
        .unwrap();
    let backlog = store.backlog().await.unwrap();
    assert_eq!((backlog.pending, backlog.dead), (1, 1));
    // Waiting since it arrived, by the database's clock: the writer's `-infinity` is not
    // trusted for the lag.
    assert!(backlog.oldest_age.unwrap() < Duration::from_secs(3600));
    let partitions = store.partition_status().await.unwrap();
    assert_eq!(partitions.iter().map(|p| p.pending).sum::<i64>(), 1);
    let admin = outbox_relayer::admin::Admin::new(db.pool.clone(), &db.tables);
    let listed = admin.dead_letters(&Default::default()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, dead);
    let _ = pending;
}

/// Valid jsonb that no JSON parser reads, and metadata too large to load: each such row is a
/// dead letter naming the column, its follower waits (parked), and every other event reaches
/// NATS. (A number beyond f64 in `headers` used to fail every claim: nothing was published,
/// for ever, and `/readyz` stayed 200.)
#[tokio::test]
async fn rows_the_relay_cannot_read_are_dead_letters_and_the_rest_reach_nats() {
    let db = TestDb::new(4).await;
    let prefix = unique("p");
    let reader = NatsReader::start(NATS_URL, &unique("S"), &prefix).await;
    let good = |aggregate: String, n: usize| SqlRow {
        aggregate_type: "order".into(),
        aggregate_id: aggregate,
        aggregate_version: None,
        event_type: "Placed".into(),
        schema_version: 1,
        destination: None,
        payload: n.to_string().into_bytes(),
        content_type: "text/plain".into(),
        headers: "{}".into(),
        occurred_at: None,
    };
    let incompressible: String = sqlx::query_scalar(
        "SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 2500)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let hostile = [
        (
            "headers",
            good("h1".into(), 0).with_headers(r#"{"n": 1e400}"#.into()),
        ),
        (
            "headers",
            good("h2".into(), 0).with_headers(format!(
                r#"{{"deep": {}0{}}}"#,
                "[".repeat(300),
                "]".repeat(300)
            )),
        ),
        (
            "headers are",
            good("h3".into(), 0).with_headers(format!(r#"{{"big": "{incompressible}"}}"#)),
        ),
        (
            "event_type is",
            SqlRow {
                event_type: incompressible[..5000].to_owned(),
                ..good("h4".into(), 0)
            },
        ),
    ];
    let mut dead_ids = Vec::new();
    let mut followers = Vec::new();
    for (word, row) in &hostile {
        dead_ids.push((*word, insert(&db, row).await.expect("accepted")));
        followers.push(
            insert(&db, &good(row.aggregate_id.clone(), 1))
                .await
                .unwrap(),
        );
    }
    for n in 0..300 {
        insert(&db, &good(format!("a{}", n % 30), n)).await.unwrap();
    }
    let relay = common::start(
        &db,
        common::nats(NATS_URL, &reader.stream).await,
        common::fast_config(&db, &prefix),
    )
    .await;
    let got = reader.wait_for(300, SETTLE).await;
    outbox_testkit::wait_until("the unreadable rows to be dead", SETTLE, || async {
        db.count("dead").await == hostile.len() as i64
    })
    .await;
    relay.shutdown().await.expect("the relay stops cleanly");
    assert_eq!(got.len(), 300, "every readable event, once");
    assert!(got.iter().all(|d| d.aggregate_id.starts_with('a')));
    for (word, id) in dead_ids {
        let error: String =
            sqlx::query_scalar(&db.tables.render(
                "SELECT last_error FROM {schema}.{events} WHERE id = $1 AND status = 'dead'",
            ))
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert!(error.contains(word), "row {id}: {error}");
        assert!(error.len() < 1000, "the reason stays short: {error}");
    }
    for id in followers {
        let status: String = sqlx::query_scalar(
            &db.tables
                .render("SELECT status FROM {schema}.{events} WHERE id = $1"),
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(status, "pending", "parked behind its dead head");
    }
    // The dead-letter list reads them all, the unparsable headers as their text.
    let admin = outbox_relayer::admin::Admin::new(db.pool.clone(), &db.tables);
    assert_eq!(
        admin.dead_letters(&Default::default()).await.unwrap().len(),
        4
    );
    reader.cleanup().await;
}

impl SqlRow {
    fn with_headers(self, headers: String) -> Self {
        Self { headers, ..self }
    }
}
