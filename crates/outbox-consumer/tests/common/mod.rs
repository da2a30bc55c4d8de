//! A stock-reserving handler that records every application, so a test can count them.
#![allow(dead_code)]

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;
use outbox_consumer::{Count, Envelope, Handler, HandlerError, Processor};
use outbox_testkit::{wait_until, PrivatePostgres, TestDb};
use sqlx::{postgres::PgPoolOptions, PgConnection};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Reserves `qty` of `sku` (from the JSON payload) and logs the event id in `applied`
/// (deliberately without a unique key: a double application would show).
pub struct ReserveStock {
    stock_sql: String,
    log_sql: String,
    /// Fail this many times per event before succeeding.
    pub fail_first: u32,
    /// Always fail events of this type, until `cured`.
    pub poison_type: Option<String>,
    /// The fix for `poison_type` is deployed.
    pub cured: std::sync::atomic::AtomicBool,
    /// Always panic on events of this type.
    pub panic_type: Option<String>,
    /// Handler calls per event id.
    pub calls: Mutex<HashMap<Uuid, u32>>,
}

impl ReserveStock {
    pub async fn install(db: &TestDb) -> Self {
        db.exec(
            "CREATE TABLE {schema}.stock (sku text PRIMARY KEY, reserved int NOT NULL DEFAULT 0);
             CREATE TABLE {schema}.applied (event_id uuid NOT NULL);
             INSERT INTO {schema}.stock (sku) VALUES ('apple'), ('pear');",
        )
        .await;
        Self {
            stock_sql: db
                .tables
                .render("UPDATE {schema}.stock SET reserved = reserved + $2 WHERE sku = $1"),
            log_sql: db
                .tables
                .render("INSERT INTO {schema}.applied (event_id) VALUES ($1)"),
            fail_first: 0,
            poison_type: None,
            cured: Default::default(),
            panic_type: None,
            calls: Mutex::new(HashMap::new()),
        }
    }

    pub fn calls(&self, id: Uuid) -> u32 {
        self.calls.lock().unwrap().get(&id).copied().unwrap_or(0)
    }
}

impl Handler for ReserveStock {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let n = {
                let mut calls = self.calls.lock().unwrap();
                let n = calls.entry(event.event_id).or_insert(0);
                *n += 1;
                *n
            };
            if self.poison_type.as_deref() == Some(event.event_type.as_str())
                && !self.cured.load(std::sync::atomic::Ordering::SeqCst)
            {
                return Err(HandlerError::new("cannot reserve: poison"));
            }
            if self.panic_type.as_deref() == Some(event.event_type.as_str()) {
                panic!("the handler's bug, event {}", event.event_id);
            }
            let body: serde_json::Value = event.json()?;
            sqlx::query(&self.stock_sql)
                .bind(body["sku"].as_str().unwrap_or_default())
                .bind(body["qty"].as_i64().unwrap_or(0) as i32)
                .execute(&mut *tx)
                .await?;
            sqlx::query(&self.log_sql)
                .bind(event.event_id)
                .execute(&mut *tx)
                .await?;
            if n <= self.fail_first {
                // The writes above are rolled back with the transaction.
                return Err(HandlerError::new(format!("transient failure {n}")));
            }
            Ok(())
        })
    }
}

const WAIT: Duration = Duration::from_secs(60);

pub fn processor(db: &TestDb, name: &str, handler: Arc<ReserveStock>) -> Processor {
    Processor::new(db.pool.clone(), &db.tables, name, handler)
}

pub async fn applied(db: &TestDb) -> i64 {
    sqlx::query_scalar(&db.tables.render("SELECT count(*) FROM {schema}.applied"))
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

pub async fn distinct_applied(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        &db.tables
            .render("SELECT count(DISTINCT event_id) FROM {schema}.applied"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

pub async fn reserved(db: &TestDb, sku: &str) -> i64 {
    sqlx::query_scalar::<_, i32>(
        &db.tables
            .render("SELECT reserved FROM {schema}.stock WHERE sku = $1"),
    )
    .bind(sku)
    .fetch_one(&db.pool)
    .await
    .unwrap() as i64
}

/// Headers as the relay sets them.
pub fn relay_headers(id: Uuid, event_type: &str) -> Vec<(&'static str, String)> {
    vec![
        ("event-id", id.to_string()),
        ("event-type", event_type.to_owned()),
        ("schema-version", "1".into()),
        ("aggregate-type", "order".into()),
        ("aggregate-id", "o-1".into()),
        ("content-type", "application/json".into()),
    ]
}

/// A database that goes down while a consumer runs: the outbox on a private PostgreSQL server,
/// the stock handler, and a processor whose pool gives up on a connection after 200 ms.
pub struct Outage {
    pub server: PrivatePostgres,
    pub db: TestDb,
    pub handler: Arc<ReserveStock>,
    pub processor: Processor,
}

impl Outage {
    pub async fn start(name: &str) -> Self {
        let server = PrivatePostgres::start().await;
        let db = TestDb::on(&server.url(), Default::default()).await;
        let handler = Arc::new(ReserveStock::install(&db).await);
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_millis(200))
            .connect(&server.url())
            .await
            .unwrap();
        let processor = Processor::new(pool, &db.tables, name, handler.clone());
        Self {
            server,
            db,
            handler,
            processor,
        }
    }

    /// Waits until the processor has met the outage 6 times (more tries than the 5 events it
    /// is given: a runner that spent attempts on the outage has tried one event twice and, with
    /// `max_attempts` 2, dead-lettered it), starts the server again, and checks that each of
    /// `ids` was then applied once, with no failure and no dead letter.
    pub async fn end_and_check(&mut self, ids: &[Uuid]) {
        let metrics = self.processor.metrics().clone();
        let name = self.processor.name().to_owned();
        let tries = || metrics.count(&name, Count::InfrastructureFailures);
        wait_until("6 tries against the stopped database", WAIT, || {
            let tries = tries();
            async move { tries >= 6 }
        })
        .await;
        self.server.start_again().await;
        let db = &self.db;
        // The count follows the commit: both, before anything is checked.
        wait_until("the events applied and counted", WAIT, || async {
            applied(db).await == ids.len() as i64
                && metrics.count(&name, Count::Handled) >= ids.len() as u64
        })
        .await;
        assert_eq!(metrics.count(&name, Count::Failures), 0);
        assert_eq!(metrics.count(&name, Count::DeadLettered), 0);
        assert_eq!(metrics.count(&name, Count::Handled), ids.len() as u64);
        assert_eq!(reserved(db, "apple").await, ids.len() as i64);
        for id in ids {
            assert_eq!(self.handler.calls(*id), 1, "the handler ran once per event");
        }
    }
}

/// The audit records of consumer replays: (actor, reason, details).
pub async fn replay_audit(db: &TestDb) -> Vec<(String, String, serde_json::Value)> {
    sqlx::query_as(&db.tables.render(
        "SELECT actor, reason, details FROM {schema}.audit \
         WHERE action = 'consumer_replay' ORDER BY id",
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Records the order events are applied in, per aggregate, in a table with an identity column;
/// fails the first `fail_first` attempts of each aggregate in `flaky`.
pub struct Ledger {
    record_sql: String,
    pub flaky: Vec<String>,
    pub fail_first: u32,
    attempts: Mutex<HashMap<String, u32>>,
    /// When set, the first `n` calls wait here for each other (at most 10 s, then fail):
    /// they meet only if the runner handles `n` messages at once.
    rendezvous: Option<(usize, tokio::sync::Barrier)>,
    calls: std::sync::atomic::AtomicUsize,
}

impl Ledger {
    pub async fn install(db: &TestDb) -> Self {
        db.exec(
            "CREATE TABLE {schema}.ledger (n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 aggregate_id text NOT NULL, version bigint NOT NULL)",
        )
        .await;
        Self::on(db)
    }

    /// The handler on a ledger installed already (a second runner's).
    pub fn on(db: &TestDb) -> Self {
        Self {
            record_sql: db
                .tables
                .render("INSERT INTO {schema}.ledger (aggregate_id, version) VALUES ($1, $2)"),
            flaky: Vec::new(),
            fail_first: 0,
            attempts: Mutex::new(HashMap::new()),
            rendezvous: None,
            calls: Default::default(),
        }
    }

    /// The ledger whose first `n` calls must run at the same time.
    pub fn meeting(mut self, n: usize) -> Self {
        self.rendezvous = Some((n, tokio::sync::Barrier::new(n)));
        self
    }

    /// Per aggregate, the versions in the order they were applied.
    pub async fn applied(db: &TestDb) -> HashMap<String, Vec<i64>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            &db.tables
                .render("SELECT aggregate_id, version FROM {schema}.ledger ORDER BY n"),
        )
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let mut out: HashMap<String, Vec<i64>> = HashMap::new();
        for (id, version) in rows {
            out.entry(id).or_default().push(version);
        }
        out
    }

    pub async fn count(db: &TestDb) -> i64 {
        sqlx::query_scalar(&db.tables.render("SELECT count(*) FROM {schema}.ledger"))
            .fetch_one(&db.pool)
            .await
            .unwrap()
    }
}

impl Handler for Ledger {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let id = event.aggregate_id.clone().unwrap_or_default();
            let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Some((n, barrier)) = &self.rendezvous {
                if call < *n {
                    tokio::time::timeout(Duration::from_secs(10), barrier.wait())
                        .await
                        .map_err(|_| HandlerError::new("handled alone: no one to meet"))?;
                }
            }
            if self.flaky.contains(&id) {
                let mut attempts = self.attempts.lock().unwrap();
                let n = attempts.entry(id.clone()).or_insert(0);
                *n += 1;
                if *n <= self.fail_first {
                    return Err(HandlerError::new(format!("{id} is flaky ({n})")));
                }
            }
            sqlx::query(&self.record_sql)
                .bind(&id)
                .bind(event.aggregate_version.unwrap_or(-1))
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}

/// Headers as the relay sets them for version `version` of order `aggregate`.
pub fn versioned_headers(id: Uuid, aggregate: &str, version: i64) -> Vec<(&'static str, String)> {
    let mut headers = relay_headers(id, "OrderChanged");
    headers.retain(|(k, _)| *k != "aggregate-id");
    headers.push(("aggregate-id", aggregate.to_owned()));
    headers.push(("aggregate-version", version.to_string()));
    headers
}

/// Checks that every aggregate in `expected` (id → last version) had each version applied
/// once, in order.
pub fn assert_in_order(applied: &HashMap<String, Vec<i64>>, expected: &[(String, i64)]) {
    for (id, last) in expected {
        let want: Vec<i64> = (1..=*last).collect();
        assert_eq!(applied.get(id), Some(&want), "aggregate {id}");
    }
    assert_eq!(applied.len(), expected.len(), "no other aggregate");
}

/// An aggregate id and a version.
pub type Versioned = (String, i64);

/// 50 aggregates with versions 1..=3 and one, `slow`, with 1..=5, interleaved as the relay
/// publishes them (in order per aggregate): (aggregate, version) per message, and the
/// expected last version per aggregate.
pub fn interleaved() -> (Vec<Versioned>, Vec<Versioned>) {
    let mut expected: Vec<(String, i64)> = (0..50).map(|n| (format!("a{n}"), 3)).collect();
    expected.push(("slow".into(), 5));
    let mut messages = Vec::new();
    for version in 1..=5 {
        for (id, last) in &expected {
            if version <= *last {
                messages.push((id.clone(), version));
            }
        }
    }
    (messages, expected)
}

/// The ledger handler with `slow` failing its first three attempts.
pub async fn flaky_ledger(db: &TestDb) -> Arc<Ledger> {
    let mut ledger = Ledger::install(db).await;
    ledger.flaky = vec!["slow".into()];
    ledger.fail_first = 3;
    Arc::new(ledger)
}

/// Events the consumer holds in its database (0 where the table does not exist).
pub async fn held_rows(db: &TestDb) -> i64 {
    let exists: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(format!("{}.consumer_held", db.tables.schema().as_str()))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    if exists.is_none() {
        return 0;
    }
    sqlx::query_scalar(
        &db.tables
            .render("SELECT count(*) FROM {schema}.consumer_held"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Records the order events are applied in (the `ledger` table of [`Ledger`]), fails chosen
/// (aggregate, version) pairs a number of times, and measures how many calls of one aggregate
/// ran at once: the first two calls of an aggregate wait up to `meet` for each other, so a
/// runner that runs an aggregate's messages concurrently shows it.
pub struct Sequencer {
    record_sql: String,
    failures: Mutex<HashMap<(String, i64), u32>>,
    running: Mutex<HashMap<String, usize>>,
    most_at_once: Mutex<HashMap<String, usize>>,
    meet: Duration,
    meetings: Mutex<HashMap<String, Arc<tokio::sync::Barrier>>>,
}

impl Sequencer {
    pub async fn install(db: &TestDb) -> Self {
        Ledger::install(db).await;
        Self {
            record_sql: db
                .tables
                .render("INSERT INTO {schema}.ledger (aggregate_id, version) VALUES ($1, $2)"),
            failures: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            most_at_once: Mutex::new(HashMap::new()),
            meet: Duration::ZERO,
            meetings: Mutex::new(HashMap::new()),
        }
    }

    /// Fails version `version` of `aggregate` its first `times` calls.
    pub fn failing(self, aggregate: &str, version: i64, times: u32) -> Self {
        self.failures
            .lock()
            .unwrap()
            .insert((aggregate.to_owned(), version), times);
        self
    }

    /// The first two calls of each aggregate wait up to `meet` for each other.
    pub fn meeting_for(mut self, meet: Duration) -> Self {
        self.meet = meet;
        self
    }

    /// The most calls of `aggregate` that ran at once.
    pub fn most_at_once(&self, aggregate: &str) -> usize {
        self.most_at_once
            .lock()
            .unwrap()
            .get(aggregate)
            .copied()
            .unwrap_or(0)
    }
}

impl Handler for Sequencer {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let id = event.aggregate_id.clone().unwrap_or_default();
            let version = event.aggregate_version.unwrap_or(-1);
            {
                let mut running = self.running.lock().unwrap();
                let now = running.entry(id.clone()).or_insert(0);
                *now += 1;
                let mut most = self.most_at_once.lock().unwrap();
                let most = most.entry(id.clone()).or_insert(0);
                *most = (*most).max(*now);
            }
            if !self.meet.is_zero() {
                let barrier = self
                    .meetings
                    .lock()
                    .unwrap()
                    .entry(id.clone())
                    .or_insert_with(|| Arc::new(tokio::sync::Barrier::new(2)))
                    .clone();
                let _ = tokio::time::timeout(self.meet, barrier.wait()).await;
            }
            let fail = {
                let mut failures = self.failures.lock().unwrap();
                match failures.get_mut(&(id.clone(), version)) {
                    Some(left) if *left > 0 => {
                        *left -= 1;
                        true
                    }
                    _ => false,
                }
            };
            let result = if fail {
                Err(HandlerError::new(format!(
                    "{id} v{version} fails on purpose"
                )))
            } else {
                sqlx::query(&self.record_sql)
                    .bind(&id)
                    .bind(version)
                    .execute(&mut *tx)
                    .await
                    .map(drop)
                    .map_err(HandlerError::from)
            };
            *self.running.lock().unwrap().get_mut(&id).unwrap() -= 1;
            result
        })
    }
}

/// Headers of a CloudEvent in binary mode as the relay sends it on NATS (`ce-` prefix) or
/// RabbitMQ (`cloudEvents:` prefix): version `version` of order `aggregate`.
pub fn cloudevent_headers(
    prefix: &str,
    id: &str,
    source: &str,
    aggregate: &str,
    version: Option<i64>,
) -> Vec<(String, String)> {
    let mut headers = vec![
        (format!("{prefix}specversion"), "1.0".to_owned()),
        (format!("{prefix}id"), id.to_owned()),
        (format!("{prefix}source"), source.to_owned()),
        (format!("{prefix}type"), "OrderChanged".to_owned()),
        (format!("{prefix}subject"), aggregate.to_owned()),
        (format!("{prefix}aggregatetype"), "order".to_owned()),
        ("content-type".to_owned(), "application/json".to_owned()),
    ];
    if let Some(version) = version {
        headers.push((format!("{prefix}aggregateversion"), version.to_string()));
    }
    headers
}

/// What [`Scripted`] does on a call.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    /// Fails; the event is held and tried again.
    Fail,
    /// Fails for good; the event is dead-lettered at once.
    Permanent,
    /// Its dependency is down: an outage, not an attempt.
    Outage,
    /// Writes a row that breaks a deferred unique constraint: the handler returns `Ok` and
    /// the transaction fails at its COMMIT.
    FailAtCommit,
    /// Waits until the test releases it (at most a minute), then records the event: a handler
    /// waiting on a lock or on a dependency without a timeout.
    Hang,
}

/// Records (aggregate id, version) in the ledger of [`Ledger`]; per (aggregate, version; -1
/// for no version), a script of steps consumed call by call (then success), and the headers
/// of its last call.
pub struct Scripted {
    record_sql: String,
    break_at_commit_sql: String,
    script: Mutex<HashMap<(String, i64), VecDeque<Step>>>,
    calls: Mutex<HashMap<(String, i64), u32>>,
    headers: Mutex<HashMap<(String, i64), BTreeMap<String, String>>>,
    /// Ends every hang, current and to come.
    pub release: CancellationToken,
}

impl Scripted {
    pub async fn install(db: &TestDb) -> Self {
        Ledger::install(db).await;
        // Checked at COMMIT: what `Step::FailAtCommit` writes twice.
        db.exec(
            "CREATE TABLE {schema}.once \
             (k int CONSTRAINT once_k UNIQUE DEFERRABLE INITIALLY DEFERRED)",
        )
        .await;
        Self {
            record_sql: db
                .tables
                .render("INSERT INTO {schema}.ledger (aggregate_id, version) VALUES ($1, $2)"),
            break_at_commit_sql: db
                .tables
                .render("INSERT INTO {schema}.once (k) VALUES (1), (1)"),
            script: Mutex::new(HashMap::new()),
            calls: Mutex::new(HashMap::new()),
            headers: Mutex::new(HashMap::new()),
            release: CancellationToken::new(),
        }
    }

    /// Version `version` of `aggregate` takes `steps`, one per call.
    pub fn script(self, aggregate: &str, version: i64, steps: &[Step]) -> Self {
        self.script
            .lock()
            .unwrap()
            .insert((aggregate.into(), version), steps.iter().copied().collect());
        self
    }

    /// Calls so far of version `version` of `aggregate`.
    pub fn calls(&self, aggregate: &str, version: i64) -> u32 {
        self.calls
            .lock()
            .unwrap()
            .get(&(aggregate.to_owned(), version))
            .copied()
            .unwrap_or(0)
    }

    /// Header `name` as the handler last saw it on `aggregate`'s `version`.
    pub fn header(&self, aggregate: &str, version: i64, name: &str) -> Option<String> {
        self.headers
            .lock()
            .unwrap()
            .get(&(aggregate.to_owned(), version))
            .and_then(|headers| headers.get(name).cloned())
    }
}

impl Handler for Scripted {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let key = (
                event.aggregate_id.clone().unwrap_or_default(),
                event.aggregate_version.unwrap_or(-1),
            );
            *self.calls.lock().unwrap().entry(key.clone()).or_insert(0) += 1;
            self.headers
                .lock()
                .unwrap()
                .insert(key.clone(), event.headers.clone());
            let step = self
                .script
                .lock()
                .unwrap()
                .get_mut(&key)
                .and_then(VecDeque::pop_front);
            match step {
                Some(Step::Fail) => return Err(HandlerError::new(format!("{key:?} fails"))),
                Some(Step::Permanent) => {
                    return Err(HandlerError::permanent(format!("{key:?} is poison")))
                }
                Some(Step::Outage) => {
                    return Err(HandlerError::infrastructure(
                        "payments API unreachable (connection refused)",
                    ))
                }
                Some(Step::FailAtCommit) => {
                    sqlx::query(&self.break_at_commit_sql)
                        .execute(&mut *tx)
                        .await?;
                }
                Some(Step::Hang) => {
                    let limit = Duration::from_secs(60);
                    let _ = tokio::time::timeout(limit, self.release.cancelled()).await;
                }
                None => {}
            }
            sqlx::query(&self.record_sql)
                .bind(&key.0)
                .bind(key.1)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}
