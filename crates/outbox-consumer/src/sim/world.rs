//! The consumer's side of a seed: its database (a schema of its own, the ledger its handler
//! writes), the handler and its faults, the dead letters, the operator, and the oracle.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    str::FromStr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use futures::future::BoxFuture;
use outbox_testkit::{database_url, TestDb};
use rand::{rngs::StdRng, Rng, SeedableRng};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgConnection, PgPool,
};
use uuid::Uuid;

use super::plan::Plan;
use crate::{
    versions::{ConsumerVersions, Filter},
    ConsumerConfig, DeadLetters, Envelope, Handler, HandlerError, Message, Processor, VersionGate,
};

/// Records each event it applies in `ledger` (identity column: the order of application);
/// fails some tries while faults are on: a few events always (until cured), others now and
/// then, with an error or a panic.
pub(super) struct Ledger {
    sql: String,
    rng: Mutex<StdRng>,
    /// Events that fail every try until cured.
    poison: HashSet<Uuid>,
    pub(super) calm: AtomicBool,
    /// Calls running now, per aggregate; and the most seen at once for any aggregate.
    running: Mutex<HashMap<String, usize>>,
    pub(super) most_at_once: std::sync::atomic::AtomicUsize,
}

/// Counts a call of an aggregate's handler as running until dropped.
struct Running<'a>(&'a Ledger, String);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.0.running.lock().expect("running").get_mut(&self.1) {
            *n -= 1;
        }
    }
}

impl Handler for Ledger {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let aggregate = event.aggregate_id.clone().unwrap_or_default();
            let _running = {
                let mut running = self.running.lock().expect("running");
                let n = running.entry(aggregate.clone()).or_default();
                *n += 1;
                self.most_at_once.fetch_max(*n, Ordering::SeqCst);
                Running(self, aggregate)
            };
            // Long enough for a second call of the same aggregate, were it run at once, to
            // overlap this one.
            tokio::task::yield_now().await;
            sqlx::query(&self.sql)
                .bind(event.event_id)
                .bind(event.aggregate_id.as_deref())
                .bind(event.aggregate_version)
                .execute(&mut *tx)
                .await?;
            if self.calm.load(Ordering::SeqCst) {
                return Ok(());
            }
            if self.poison.contains(&event.event_id) {
                return Err(HandlerError::new("poison: fails until cured"));
            }
            let roll = self.rng.lock().expect("rng").random_range(0..100);
            match roll {
                0..=7 => Err(HandlerError::new("a transient failure")),
                8..=9 => panic!("the handler's bug (simulated)"),
                _ => Ok(()),
            }
        })
    }
}

/// Dead letters, as the broker's dead-letter destination keeps them: (reason, message).
#[derive(Default)]
pub(super) struct Letters(pub(super) Mutex<Vec<(String, Message)>>);

impl DeadLetters for Letters {
    fn dead_letter<'a>(
        &'a self,
        message: &'a Message,
        reason: &'a str,
        _attempts: u32,
        _origin: &'a [(&'static str, String)],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.0
                .lock()
                .expect("letters")
                .push((reason.to_owned(), message.clone()));
            Ok(())
        })
    }
}

/// Where a seed's aggregates start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gate {
    StartingAtOne,
    FirstSeen,
    /// No version gate: arrival order, each event once.
    None,
}

/// The consumer's database and handler.
pub(super) struct World {
    pub(super) db: TestDb,
    pub(super) pool: PgPool,
    app: String,
    pub(super) ledger: Arc<Ledger>,
    pub(super) processor: Processor,
    pub(super) config: ConsumerConfig,
    pub(super) gate: Gate,
}

impl World {
    pub(super) async fn new(seed: u64, plan: &Plan, gate: Gate, rng: &mut StdRng) -> Self {
        let db = TestDb::new(2).await;
        db.exec(
            "CREATE TABLE {schema}.ledger (n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 event_id uuid NOT NULL, aggregate_id text NOT NULL, version bigint NOT NULL)",
        )
        .await;
        let app = format!("runner-sim-{seed}-{}", &db.schema);
        let options = PgConnectOptions::from_str(&database_url())
            .expect("url")
            .application_name(&app);
        // A crash drops the runner's futures, one of them perhaps inside `BEGIN`: the guard
        // keeps the transaction sqlx does not know of out of the pool (see
        // `outbox::postgres::outside_transaction`), as a service that aborts tasks must.
        let pool = PgPoolOptions::new()
            .max_connections(12)
            .acquire_timeout(Duration::from_secs(2))
            .after_release(|conn, _| Box::pin(outbox::postgres::outside_transaction(conn)))
            .connect_with(options)
            .await
            .expect("pool");
        let poison = plan
            .events
            .iter()
            .filter(|_| rng.random_bool(0.04))
            .map(|e| e.event_id)
            .collect();
        let ledger = Arc::new(Ledger {
            sql: db.tables.render(
                "INSERT INTO {schema}.ledger (event_id, aggregate_id, version) VALUES ($1, $2, $3)",
            ),
            rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed)),
            poison,
            calm: AtomicBool::new(false),
            running: Mutex::new(HashMap::new()),
            most_at_once: std::sync::atomic::AtomicUsize::new(0),
        });
        let mut processor = Processor::new(pool.clone(), &db.tables, "sim", ledger.clone());
        processor = match gate {
            Gate::StartingAtOne => processor.with_version_gate(VersionGate::starting_at(1)),
            Gate::FirstSeen => processor.with_version_gate(
                VersionGate::from_first_seen().settle(Duration::from_millis(150)),
            ),
            Gate::None => processor,
        };
        let config = ConsumerConfig {
            // Now and then without limit: a poison event is then retried until it is cured,
            // never given up (the oracle checks that none is).
            max_attempts: if rng.random_bool(0.25) { u32::MAX } else { 3 },
            initial_backoff: Duration::from_millis(2),
            max_backoff: Duration::from_millis(20),
            concurrency: rng.random_range(1..=6),
            max_in_hand: rng.random_range(2..=32),
            sweep_interval: Duration::from_millis(10),
            inbox_retention: None,
            ..ConsumerConfig::new("sim")
        };
        Self {
            db,
            pool,
            app,
            ledger,
            processor,
            config,
            gate,
        }
    }

    /// Kills every connection of the consumer's pool (a database outage, a failover).
    pub(super) async fn kill_connections(&self) {
        let _ = sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&self.app)
        .execute(&self.db.pool)
        .await;
    }

    /// Per aggregate, the versions applied, in the order they were, with their event ids.
    pub(super) async fn applied(&self) -> BTreeMap<String, Vec<(i64, Uuid)>> {
        let rows: Vec<(Uuid, String, i64)> = sqlx::query_as(
            &self
                .db
                .tables
                .render("SELECT event_id, aggregate_id, version FROM {schema}.ledger ORDER BY n"),
        )
        .fetch_all(&self.db.pool)
        .await
        .expect("ledger");
        let mut out: BTreeMap<String, Vec<(i64, Uuid)>> = BTreeMap::new();
        for (id, aggregate, version) in rows {
            out.entry(aggregate).or_default().push((version, id));
        }
        out
    }

    /// The held events: (aggregate, version, due, reason).
    pub(super) async fn held(&self) -> Vec<(Option<String>, Option<i64>, bool, String)> {
        sqlx::query_as(&self.db.tables.render(
            "SELECT aggregate_id, version, next_attempt_at IS NOT NULL, reason \
             FROM {schema}.consumer_held ORDER BY id",
        ))
        .fetch_all(&self.db.pool)
        .await
        .expect("held")
    }

    /// The version state rows: (aggregate, version, first version, seeded, held).
    pub(super) async fn versions(&self) -> Vec<(String, Option<i64>, Option<i64>, bool, i32)> {
        sqlx::query_as(&self.db.tables.render(
            "SELECT aggregate_id, version, first_version, seeded, held \
             FROM {schema}.consumer_versions ORDER BY aggregate_id",
        ))
        .fetch_all(&self.db.pool)
        .await
        .expect("versions")
    }

    /// Whether the inbox has the message's event.
    pub(super) async fn in_inbox(&self, message: &Message) -> bool {
        let key = message.decode().expect("decodes").message_id;
        sqlx::query_scalar(&self.db.tables.render(
            "SELECT EXISTS (SELECT 1 FROM {schema}.inbox WHERE consumer = 'sim' AND event_id = $1)",
        ))
        .bind(key)
        .fetch_one(&self.db.pool)
        .await
        .expect("inbox")
    }

    /// Whether a held event is due now or soon (a retry, a settling aggregate): the consumer
    /// still has work it will do without help.
    /// The consumer's database sessions that are inside a transaction: state, how long, what
    /// they wait on, their last statement (to tell a stuck drain's cause).
    pub(super) async fn sessions(&self) -> Vec<(String, f64, Option<String>, String)> {
        sqlx::query_as(
            "SELECT state, extract(epoch FROM now() - xact_start)::float8,
                    wait_event_type || ':' || wait_event, left(query, 200)
             FROM pg_stat_activity
             WHERE application_name = $1 AND xact_start IS NOT NULL",
        )
        .bind(&self.app)
        .fetch_all(&self.db.pool)
        .await
        .unwrap_or_default()
    }

    pub(super) async fn busy(&self) -> bool {
        self.held().await.iter().any(|(_, _, due, _)| *due)
    }

    /// The operator ends every gap that will never fill: each aggregate holding events moves
    /// past the versions missing before them (audited), as `outbox consumer-versions skip`.
    pub(super) async fn skip_gaps(&self) -> usize {
        let tools = ConsumerVersions::new(self.db.pool.clone(), &self.db.tables, "sim");
        let held = tools
            .list(&Filter {
                held_only: true,
                limit: 10_000,
                ..Filter::default()
            })
            .await
            .expect("list");
        for aggregate in &held {
            tools
                .skip(
                    &aggregate.aggregate_type,
                    &aggregate.aggregate_id,
                    None,
                    false,
                    "operator",
                    "the relay skipped that version",
                )
                .await
                .expect("skip");
        }
        held.len()
    }

    /// Audit records of the operator's skips.
    pub(super) async fn skips_audited(&self) -> i64 {
        sqlx::query_scalar(
            &self
                .db
                .tables
                .render("SELECT count(*) FROM {schema}.audit WHERE action = 'consumer_skip'"),
        )
        .fetch_one(&self.db.pool)
        .await
        .expect("audit")
    }

    pub(super) async fn close(self) {
        self.pool.close().await;
    }
}

/// Every event's fate, for the oracle.
#[derive(Debug, Default)]
pub(super) struct Fates {
    /// Dead letters the operator may not replay: below a first-seen aggregate's start.
    pub(super) below_start: HashSet<Uuid>,
}

/// The oracle, once everything is settled and the gaps are skipped.
///
/// - every event delivered to the consumer was applied exactly once, or is a dead letter that
///   can never apply in order (below its aggregate's first-seen start), never both;
/// - each aggregate's versions applied in increasing order (with a gate);
/// - nothing is held any more.
pub(super) fn check(
    seed: u64,
    what: &str,
    plan: &Plan,
    delivered: &HashSet<Uuid>,
    applied: &BTreeMap<String, Vec<(i64, Uuid)>>,
    fates: &Fates,
    gate: Gate,
) {
    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    for rows in applied.values() {
        for (_, id) in rows {
            *seen.entry(*id).or_default() += 1;
        }
    }
    for (id, n) in &seen {
        assert_eq!(*n, 1, "{what} seed {seed}: event {id} applied {n} times");
        assert!(
            !fates.below_start.contains(id),
            "{what} seed {seed}: event {id} applied and dead-lettered below its start"
        );
    }
    for event in &plan.events {
        let id = event.event_id;
        if !delivered.contains(&id) {
            assert!(
                !seen.contains_key(&id),
                "{what} seed {seed}: {id} applied but never delivered"
            );
            continue;
        }
        assert!(
            seen.contains_key(&id) || fates.below_start.contains(&id),
            "{what} seed {seed}: {} v{} ({id}) delivered but neither applied nor dead-lettered \
             with a reason",
            event.aggregate,
            event.version
        );
    }
    if gate != Gate::None {
        for (aggregate, rows) in applied {
            let versions: Vec<i64> = rows.iter().map(|(v, _)| *v).collect();
            assert!(
                versions.windows(2).all(|w| w[0] < w[1]),
                "{what} seed {seed}: {aggregate} applied out of order: {versions:?}"
            );
        }
    }
}
