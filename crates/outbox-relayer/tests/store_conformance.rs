//! One behaviour suite that every relay storage backend passes: PostgreSQL, MySQL (run on
//! MariaDB), SQLite, and the
//! in-memory model of the deterministic simulation (`outbox-sim`), which must behave as the real
//! ones do for the simulation's findings to hold. The operators' dead-letter replay and skip
//! (`outbox_relayer::admin`) are part of it: they change event state on every backend.

use std::{sync::Arc, time::Duration};

use outbox::{postgres::PgOutbox, sqlite::SqliteOutbox, Event, Outbox, Tables};
use outbox_relayer::{
    admin::{Admin, Replayed},
    mysql::MySqlStore,
    postgres::PgStore,
    sqlite::SqliteStore,
    store::{Failure, Marking, Store},
};
use outbox_testkit::{MySqlDb, SqliteFile, TestDb};
use sqlx::sqlite::SqlitePool;

const TTL: Duration = Duration::from_secs(30);
const MAX: usize = 1024;

/// A backend under test: its store, and a writer plus a status reader on the same outbox.
struct Backend {
    store: Arc<dyn Store>,
    write: Writer,
    /// The operator actions (the model applies its own, `outbox-sim`'s `db_admin.rs`).
    admin: Option<Admin>,
    _pg: Option<TestDb>,
    _file: Option<SqliteFile>,
}

enum Writer {
    Pg(TestDb),
    MySql(MySqlDb),
    Sqlite(SqlitePool, Tables),
    Model(Arc<outbox_sim::world::World>),
}

impl Backend {
    async fn postgres() -> Self {
        let db = TestDb::new(1).await;
        let store = PgStore::open(db.pool.clone(), &db.tables).await.unwrap();
        let writer_db = TestDb::adopt(db.pool.clone(), db.tables.clone());
        Self {
            store: Arc::new(store),
            admin: Some(Admin::new(db.pool.clone(), &db.tables)),
            write: Writer::Pg(writer_db),
            _pg: Some(db),
            _file: None,
        }
    }

    async fn sqlite() -> Self {
        let file = SqliteFile::new().await;
        let (pool, tables) = (file.pool.clone(), file.tables.clone());
        let store = SqliteStore::open(pool.clone(), &tables).await.unwrap();
        Self {
            store: Arc::new(store),
            admin: Some(Admin::sqlite(pool.clone(), &tables)),
            write: Writer::Sqlite(pool, tables),
            _pg: None,
            _file: Some(file),
        }
    }

    async fn mysql() -> Self {
        let db = MySqlDb::new(1).await;
        let store = MySqlStore::open(db.pool.clone(), &db.tables).await.unwrap();
        Self {
            store: Arc::new(store),
            admin: Some(Admin::mysql(db.pool.clone(), &db.tables)),
            write: Writer::MySql(db),
            _pg: None,
            _file: None,
        }
    }

    fn model() -> Self {
        let (world, store) = outbox_sim::model(1);
        Self {
            store: Arc::new(store),
            admin: None,
            write: Writer::Model(world),
            _pg: None,
            _file: None,
        }
    }

    async fn enqueue(&self, events: &[Event]) {
        match &self.write {
            Writer::Model(world) => {
                for e in events {
                    let (kind, id) = e.aggregate();
                    let key = (kind.to_owned(), id.to_owned());
                    world.commit_event(key, e.version().unwrap_or(0), e.payload_bytes().to_vec());
                }
            }
            Writer::Pg(db) => {
                let mut tx = db.pool.begin().await.unwrap();
                PgOutbox::new(db.tables.clone())
                    .max_payload_bytes(1 << 20)
                    .enqueue_batch(&mut tx, events)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            Writer::MySql(db) => db.enqueue(events).await,
            Writer::Sqlite(pool, tables) => {
                let mut tx = pool.begin().await.unwrap();
                SqliteOutbox::new(tables.clone())
                    .max_payload_bytes(1 << 20)
                    .enqueue_batch(&mut tx, events)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }
    }

    /// Replays dead rows `ids`; how many were replayed.
    async fn replay(&self, ids: &[i64]) -> i64 {
        match (&self.admin, &self.write) {
            (Some(admin), _) => admin.replay(ids, "test", "conformance").await.unwrap(),
            (None, Writer::Model(world)) => {
                let now = world.now();
                let mut s = world.lock();
                let db_now = now + s.skew_ms;
                s.db.replay(ids, db_now)
            }
            (None, _) => unreachable!("a database backend has its admin"),
        }
    }

    /// Skips dead rows `ids`; how many aggregates were released.
    async fn skip(&self, ids: &[i64]) -> i64 {
        match (&self.admin, &self.write) {
            (Some(admin), _) => admin.skip(ids, "test", "conformance").await.unwrap(),
            (None, Writer::Model(world)) => {
                let now = world.now();
                let mut s = world.lock();
                let db_now = now + s.skew_ms;
                ids.iter().filter(|id| s.db.skip(**id, db_now)).count() as i64
            }
            (None, _) => unreachable!("a database backend has its admin"),
        }
    }

    async fn status_of(&self, id: i64) -> String {
        match &self.write {
            Writer::Model(world) => {
                let status = world.lock().db.rows[&id].status;
                format!("{status:?}").to_lowercase()
            }
            Writer::Pg(db) => sqlx::query_scalar(
                &db.tables
                    .render("SELECT status FROM {schema}.{events} WHERE id = $1"),
            )
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap(),
            Writer::MySql(db) => sqlx::query_scalar(
                &db.tables
                    .render_mysql("SELECT status FROM {events} WHERE id = ?"),
            )
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap(),
            Writer::Sqlite(pool, tables) => sqlx::query_scalar(
                &tables.render_sqlite("SELECT status FROM {events} WHERE id = ?"),
            )
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap(),
        }
    }
}

/// A claim without a byte budget.
async fn claim(
    s: &Arc<dyn Store>,
    partitions: &[(i32, i64)],
    limit: i64,
) -> Vec<outbox_relayer::store::ClaimedRow> {
    s.claim(partitions, limit, MAX, i64::MAX)
        .await
        .unwrap()
        .rows
}

fn events(aggregate: &str, n: i64) -> Vec<Event> {
    (1..=n)
        .map(|v| Event::new("order", aggregate, "Happened").aggregate_version(v))
        .collect()
}

async fn leases_are_exclusive_fenced_and_handed_over(b: Backend) {
    let s = &b.store;
    let all = s.acquire("r1", 100, TTL).await.unwrap();
    assert_eq!(all.len(), s.partitions() as usize);
    assert!(
        s.acquire("r2", 100, TTL).await.unwrap().is_empty(),
        "held by r1"
    );
    assert_eq!(s.renew("r1", &all, TTL).await.unwrap().len(), all.len());
    s.release("r1", &all).await.unwrap();
    let taken = s.acquire("r2", 100, TTL).await.unwrap();
    assert_eq!(taken.len(), all.len());
    assert!(
        taken.iter().zip(&all).all(|(t, a)| t.1 == a.1 + 1),
        "epoch bumped"
    );
    assert!(
        s.renew("r1", &all, TTL).await.unwrap().is_empty(),
        "r1 lost them"
    );
    let live = s.heartbeat("r2", "host", TTL).await.unwrap();
    assert_eq!(live, vec!["r2".to_owned()]);
    s.deregister("r2").await.unwrap();
}

async fn claims_pending_rows_in_order_and_marks_them_fenced(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 3)).await;
    b.enqueue(&events("b", 2)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    assert_eq!(rows.len(), 5);
    assert!(rows.windows(2).all(|w| w[0].id < w[1].id));
    assert_eq!(s.backlog().await.unwrap().pending, 5);

    // Another relay takes over: the old owner's marks are refused.
    s.release("r1", &fences).await.unwrap();
    let theirs = s.acquire("r2", 100, TTL).await.unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    assert_eq!(
        s.mark_published("r1", &fences, &ids, Marking::Claimed)
            .await
            .unwrap()
            .len(),
        0
    );
    assert_eq!(b.status_of(ids[0]).await, "pending");
    assert_eq!(
        s.mark_published("r2", &theirs, &ids[..2], Marking::Claimed)
            .await
            .unwrap()
            .len(),
        2
    );
    assert_eq!(b.status_of(ids[0]).await, "published");
    let left = claim(s, &parts, 100).await;
    assert_eq!(left.len(), 3);
    let backlog = s.backlog().await.unwrap();
    assert_eq!((backlog.pending, backlog.dead), (3, 0));
    assert!(backlog.oldest_age.is_some());
}

async fn failures_hold_park_or_skip_the_aggregate(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 3)).await;
    b.enqueue(&events("b", 1)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    let a1 = rows.iter().find(|r| r.aggregate_id == "a").unwrap().id;
    let retry = Failure {
        id: a1,
        error: "transient: down".into(),
        backoff: Duration::from_secs(3600),
        dead: false,
        permanent: false,
    };
    assert_eq!(
        s.mark_failed("r1", &fences, &[retry], true).await.unwrap(),
        1
    );
    let rows = claim(s, &parts, 100).await;
    assert_eq!(rows.len(), 1, "a is held while its head waits: {rows:?}");
    assert_eq!(rows[0].aggregate_id, "b");

    let dead = Failure {
        id: a1,
        error: "permanent: rejected".into(),
        backoff: Duration::ZERO,
        dead: true,
        permanent: true,
    };
    assert_eq!(
        s.mark_failed("r1", &fences, &[dead], true).await.unwrap(),
        1
    );
    assert_eq!(b.status_of(a1).await, "dead");
    let rows = claim(s, &parts, 100).await;
    assert_eq!(rows.len(), 1, "a is parked behind its dead head");
    assert_eq!(s.backlog().await.unwrap().dead, 1);

    // With on_dead = skip, the aggregate's next event goes on.
    b.enqueue(&events("c", 2)).await;
    let c1 = claim(s, &parts, 100)
        .await
        .iter()
        .find(|r| r.aggregate_id == "c")
        .unwrap()
        .id;
    let skip = Failure {
        id: c1,
        error: "permanent: rejected".into(),
        backoff: Duration::ZERO,
        dead: true,
        permanent: true,
    };
    assert_eq!(
        s.mark_failed("r1", &fences, &[skip], false).await.unwrap(),
        1
    );
    let rows = claim(s, &parts, 100).await;
    assert!(rows
        .iter()
        .any(|r| r.aggregate_id == "c" && r.aggregate_version == Some(2)));

    // A retry whose backoff has elapsed is claimed again, and publishing it lifts the hold.
    b.enqueue(&events("d", 2)).await;
    let rows = claim(s, &parts, 100).await;
    let d1 = rows.iter().find(|r| r.aggregate_id == "d").unwrap().id;
    let soon = Failure {
        id: d1,
        error: "transient: blip".into(),
        backoff: Duration::ZERO,
        dead: false,
        permanent: false,
    };
    assert_eq!(
        s.mark_failed("r1", &fences, &[soon], true).await.unwrap(),
        1
    );
    let rows = claim(s, &parts, 100).await;
    let d_rows: Vec<_> = rows.iter().filter(|r| r.aggregate_id == "d").collect();
    assert_eq!(d_rows.len(), 2);
    assert_eq!(d_rows[0].attempts, 1);
    assert_eq!(
        s.mark_published("r1", &fences, &[d1], Marking::Claimed)
            .await
            .unwrap()
            .len(),
        1
    );
}

async fn oversized_payloads_are_not_loaded(b: Backend) {
    let s = &b.store;
    b.enqueue(&[
        Event::new("doc", "1", "Saved").payload(vec![7u8; MAX + 1], "application/octet-stream")
    ])
    .await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 10).await;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].payload.is_none());
    assert_eq!(rows[0].payload_size, MAX as i64 + 1);
}

async fn a_floor_starts_the_scan_and_zero_scans_everything(b: Backend) {
    let s = &b.store;
    for aggregate in ["a", "b", "c", "d"] {
        b.enqueue(&events(aggregate, 1)).await;
    }
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let all: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &all, 100).await;
    assert_eq!(rows.len(), 4);
    let from_third: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, rows[2].id)).collect();
    let later = claim(s, &from_third, 100).await;
    assert_eq!(
        later.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![rows[2].id, rows[3].id]
    );
}

/// A transaction that commits late leaves its row below a floor set while it was invisible: the
/// scan from that floor must not return the later rows of the same aggregate (G4), and the full
/// scan returns the late row first. (Found by the simulation; `outbox-sim --bug unchecked-floors`.)
async fn a_pending_row_below_the_floor_holds_back_its_aggregate(b: Backend) {
    let s = &b.store;
    let a1 = Event::new("order", "a", "Happened").aggregate_version(1);
    let a2 = Event::new("order", "a", "Happened").aggregate_version(2);
    b.enqueue(&[a1]).await;
    b.enqueue(&events("b", 2)).await;
    b.enqueue(&[a2]).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let all: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &all, 100).await;
    let order: Vec<(String, i64)> = rows
        .iter()
        .map(|r| (r.aggregate_id.clone(), r.aggregate_version.unwrap()))
        .collect();
    assert_eq!(
        order,
        [("a", 1), ("b", 1), ("b", 2), ("a", 2)].map(|(a, v)| (a.to_owned(), v))
    );
    // The floor a relay would have kept had a1 been invisible (uncommitted) at its last claim.
    let floor: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, rows[1].id)).collect();
    let scanned = claim(s, &floor, 100).await;
    let ids: Vec<i64> = scanned.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![rows[1].id, rows[2].id], "a2 waits for a1");
}

async fn a_claim_stops_at_its_byte_budget_and_always_takes_one_row(b: Backend) {
    let s = &b.store;
    let big = |n: i64| {
        Event::new("doc", n.to_string(), "Saved")
            .payload(vec![1u8; 400], "application/octet-stream")
    };
    b.enqueue(&[big(1), big(2), big(3), big(4)]).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let all = s.claim(&parts, 100, MAX, i64::MAX).await.unwrap();
    assert_eq!(all.rows.len(), 4);
    assert!(!all.cut);
    assert!(
        all.rows.iter().all(|r| r.row_bytes >= 400),
        "{:?}",
        all.rows
    );
    // Room for two rows and a bit: the third row starts past the budget.
    let budget = all.rows[0].row_bytes + all.rows[1].row_bytes + 10;
    let cut = s.claim(&parts, 100, MAX, budget).await.unwrap();
    assert_eq!(
        cut.rows.len(),
        3,
        "rows are taken while the budget is not used up"
    );
    assert!(cut.cut, "the claim says more is waiting");
    let one = s.claim(&parts, 100, MAX, 1).await.unwrap();
    assert_eq!(
        one.rows.len(),
        1,
        "one row always, however small the budget"
    );
    assert!(one.cut);
}

async fn transient_failures_leave_the_permanent_budget_alone(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 1)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let id = claim(s, &parts, 100).await[0].id;
    let failed = |permanent: bool| Failure {
        id,
        error: if permanent {
            "permanent: no"
        } else {
            "transient: down"
        }
        .into(),
        backoff: Duration::ZERO,
        dead: false,
        permanent,
    };
    for permanent in [false, false, true, false] {
        assert_eq!(
            s.mark_failed("r1", &fences, &[failed(permanent)], true)
                .await
                .unwrap(),
            1
        );
    }
    let row = &claim(s, &parts, 100).await[0];
    assert_eq!((row.attempts, row.permanent_failures), (4, 1));
}

async fn a_held_aggregate_waits_and_comes_back_whole_and_in_order_when_due(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 4)).await;
    b.enqueue(&events("b", 1)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    let a: Vec<i64> = rows
        .iter()
        .filter(|r| r.aggregate_id == "a")
        .map(|r| r.id)
        .collect();
    let retry = |backoff: Duration| Failure {
        id: a[0],
        error: "transient: down".into(),
        backoff,
        dead: false,
        permanent: false,
    };
    assert_eq!(
        s.mark_failed("r1", &fences, &[retry(Duration::from_secs(3600))], true)
            .await
            .unwrap(),
        1
    );
    // Held: nothing of `a` is claimed, however often the claim runs.
    b.enqueue(&events("a2", 1)).await;
    for _ in 0..3 {
        let rows = claim(s, &parts, 100).await;
        assert!(rows.iter().all(|r| r.aggregate_id != "a"), "{rows:?}");
    }
    // Due: the head comes with the rest, in id order...
    assert_eq!(
        s.mark_failed("r1", &fences, &[retry(Duration::ZERO)], true)
            .await
            .unwrap(),
        1
    );
    let rows = claim(s, &parts, 100).await;
    let of_a: Vec<i64> = rows
        .iter()
        .filter(|r| r.aggregate_id == "a")
        .map(|r| r.id)
        .collect();
    assert_eq!(of_a, a, "the due head first, then the rest");
    assert_eq!(rows.iter().find(|r| r.id == a[0]).unwrap().attempts, 2);
    // ... and publishing the head sets the rest free: claimed again (they were not marked).
    assert_eq!(
        s.mark_published("r1", &fences, &[a[0]], Marking::Claimed)
            .await
            .unwrap()
            .len(),
        1
    );
    let rows = claim(s, &parts, 100).await;
    let of_a: Vec<i64> = rows
        .iter()
        .filter(|r| r.aggregate_id == "a")
        .map(|r| r.id)
        .collect();
    assert_eq!(of_a, a[1..].to_vec());
}

async fn a_parked_aggregate_waits_and_a_dead_head_that_skips_lets_its_rest_go(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("p", 3)).await;
    b.enqueue(&events("r", 3)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    let first = |key: &str| rows.iter().find(|r| r.aggregate_id == key).unwrap().id;
    let dead = |id| Failure {
        id,
        error: "permanent: rejected".into(),
        backoff: Duration::ZERO,
        dead: true,
        permanent: true,
    };
    assert_eq!(
        s.mark_failed("r1", &fences, &[dead(first("p"))], true)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.mark_failed("r1", &fences, &[dead(first("r"))], false)
            .await
            .unwrap(),
        1
    );
    b.enqueue(&events("q", 1)).await;
    let later_p = Event::new("order", "p", "Changed").aggregate_version(4);
    b.enqueue(&[later_p]).await;
    for _ in 0..3 {
        let rows = claim(s, &parts, 100).await;
        assert!(
            rows.iter().all(|r| r.aggregate_id != "p"),
            "parked: {rows:?}"
        );
        let r: Vec<Option<i64>> = rows
            .iter()
            .filter(|r| r.aggregate_id == "r")
            .map(|r| r.aggregate_version)
            .collect();
        assert_eq!(
            r,
            vec![Some(2), Some(3)],
            "r goes on after its skipped head"
        );
        assert!(rows.iter().any(|r| r.aggregate_id == "q"));
    }
    assert_eq!(b.status_of(first("p")).await, "dead");
}

/// Dead-letters the first claimed row of `aggregate` (parking its aggregate) and returns its id.
async fn kill_head(s: &Arc<dyn Store>, fences: &[(i32, i64)], aggregate: &str) -> i64 {
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    let head = rows
        .iter()
        .find(|r| r.aggregate_id == aggregate)
        .unwrap()
        .id;
    let dead = Failure {
        id: head,
        error: "permanent: rejected by the broker".into(),
        backoff: Duration::ZERO,
        dead: true,
        permanent: true,
    };
    assert_eq!(s.mark_failed("r1", fences, &[dead], true).await.unwrap(), 1);
    head
}

/// The versions of `aggregate` a claim returns, in the order it returns them.
async fn versions(s: &Arc<dyn Store>, fences: &[(i32, i64)], aggregate: &str) -> Vec<i64> {
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    claim(s, &parts, 100)
        .await
        .iter()
        .filter(|r| r.aggregate_id == aggregate)
        .map(|r| r.aggregate_version.unwrap())
        .collect()
}

async fn a_replayed_dead_head_resumes_its_aggregate_from_it_in_order(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 3)).await;
    b.enqueue(&events("b", 1)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let head = kill_head(s, &fences, "a").await;
    assert_eq!(versions(s, &fences, "a").await, Vec::<i64>::new(), "parked");
    assert_eq!(b.replay(&[head]).await, 1);
    assert_eq!(b.status_of(head).await, "pending");
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    let a: Vec<_> = rows.iter().filter(|r| r.aggregate_id == "a").collect();
    assert_eq!(
        a.iter().map(|r| r.aggregate_version).collect::<Vec<_>>(),
        vec![Some(1), Some(2), Some(3)],
        "the aggregate resumes from its replayed head: {rows:?}"
    );
    assert_eq!((a[0].attempts, a[0].permanent_failures), (0, 0), "reset");
    assert_eq!(b.replay(&[head]).await, 0, "no longer dead");
    let all: Vec<i64> = rows.iter().map(|r| r.id).collect();
    assert_eq!(
        s.mark_published("r1", &fences, &all, Marking::Claimed)
            .await
            .unwrap()
            .len(),
        4
    );
    assert_eq!(s.backlog().await.unwrap().dead, 0);
}

async fn a_skipped_dead_head_stays_dead_and_lets_the_rest_go_in_order(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 3)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let head = kill_head(s, &fences, "a").await;
    assert_eq!(versions(s, &fences, "a").await, Vec::<i64>::new(), "parked");
    assert_eq!(b.skip(&[head]).await, 1);
    assert_eq!(b.status_of(head).await, "dead");
    assert_eq!(versions(s, &fences, "a").await, vec![2, 3]);
    assert_eq!(b.skip(&[head]).await, 0, "it parks nothing any more");
    assert_eq!(s.backlog().await.unwrap().dead, 1);
}

/// Aggregate a: its first event dies (parking it) and is skipped, then its second dies and
/// parks it. The operator replays the first.
async fn parked_twice(b: &Backend) -> (Vec<(i32, i64)>, i64, i64) {
    let s = &b.store;
    b.enqueue(&events("a", 4)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let first = kill_head(s, &fences, "a").await;
    assert_eq!(b.skip(&[first]).await, 1);
    let second = kill_head(s, &fences, "a").await;
    assert!(second > first);
    assert_eq!(versions(s, &fences, "a").await, Vec::<i64>::new(), "parked");
    (fences, first, second)
}

async fn a_replay_before_another_dead_letter_leaves_its_park_in_place(b: Backend) {
    let s = &b.store;
    let (fences, first, second) = parked_twice(&b).await;
    // Alone, the first is not replayed: the park records one dead event (the second), and
    // the first failing again would take it over.
    assert_eq!(b.replay(&[first]).await, 0);
    assert_eq!(b.status_of(first).await, "dead");
    if let Some(admin) = &b.admin {
        let report = admin
            .replay_report(&[first, 999_999], "test", "conformance")
            .await
            .unwrap();
        assert_eq!(
            report,
            Replayed {
                replayed: 0,
                not_replayed: vec![first],
            },
            "what the park rule left is said"
        );
    }
    assert_eq!(
        versions(s, &fences, "a").await,
        Vec::<i64>::new(),
        "still parked on the second: nothing of a passes it"
    );
    // Skipping the second lets the rest go, without the first.
    assert_eq!(b.skip(&[second]).await, 1);
    assert_eq!(versions(s, &fences, "a").await, vec![3, 4]);
}

async fn a_replay_of_both_dead_letters_resumes_the_aggregate_in_order(b: Backend) {
    let s = &b.store;
    let (fences, first, second) = parked_twice(&b).await;
    assert_eq!(b.replay(&[first, second]).await, 2);
    assert_eq!(versions(s, &fences, "a").await, vec![1, 2, 3, 4]);
}

async fn a_dead_letter_that_never_parked_is_not_replayed_before_a_park(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 3)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    // The first dies without parking (on_dead = skip), the second dies and parks.
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let first = claim(s, &parts, 100).await[0].id;
    let dead = |id| Failure {
        id,
        error: "permanent: rejected".into(),
        backoff: Duration::ZERO,
        dead: true,
        permanent: true,
    };
    assert_eq!(
        s.mark_failed("r1", &fences, &[dead(first)], false)
            .await
            .unwrap(),
        1
    );
    let second = kill_head(s, &fences, "a").await;
    assert!(second > first);
    // The first comes before the park: not replayed. After replaying the second alone, the
    // aggregate resumes from it; the first stays dead.
    assert_eq!(b.replay(&[first]).await, 0);
    assert_eq!(b.replay(&[second]).await, 1);
    assert_eq!(versions(s, &fences, "a").await, vec![2, 3]);
    assert_eq!(b.status_of(first).await, "dead");
}

async fn a_replay_after_the_parked_event_waits_behind_it(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 3)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    let (first, second) = (rows[0].id, rows[1].id);
    let dead = |id| Failure {
        id,
        error: "permanent: rejected".into(),
        backoff: Duration::ZERO,
        dead: true,
        permanent: true,
    };
    // The second dies without parking (on_dead = skip), then the first dies and parks.
    assert_eq!(
        s.mark_failed("r1", &fences, &[dead(second)], false)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.mark_failed("r1", &fences, &[dead(first)], true)
            .await
            .unwrap(),
        1
    );
    assert_eq!(versions(s, &fences, "a").await, Vec::<i64>::new(), "parked");
    // The second, after the park, is replayed and waits behind the first.
    assert_eq!(b.replay(&[second]).await, 1);
    assert_eq!(b.status_of(second).await, "pending");
    assert_eq!(
        versions(s, &fences, "a").await,
        Vec::<i64>::new(),
        "still parked"
    );
    assert_eq!(b.replay(&[first]).await, 1);
    assert_eq!(versions(s, &fences, "a").await, vec![1, 2, 3]);
}

/// A row claimed with its aggregate's later rows fails after a later one died and parked
/// the aggregate (a row that committed late, below rows already claimed): the park stays.
async fn a_failure_before_the_parked_event_leaves_the_park_in_place(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 4)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    let (first, second) = (rows[0].id, rows[1].id);
    let failed = |id, dead| Failure {
        id,
        error: if dead {
            "permanent: rejected"
        } else {
            "unavailable"
        }
        .into(),
        backoff: Duration::ZERO,
        dead,
        permanent: dead,
    };
    assert_eq!(
        s.mark_failed("r1", &fences, &[failed(second, true)], true)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.mark_failed("r1", &fences, &[failed(first, false)], true)
            .await
            .unwrap(),
        1
    );
    // Whatever becomes of the first, nothing after the second passes it while it is dead.
    for _ in 0..2 {
        let claimed = claim(s, &parts, 100).await;
        let ids: Vec<i64> = claimed.iter().map(|r| r.id).collect();
        assert!(
            claimed.iter().all(|r| r.id <= first),
            "only the first may go: {claimed:?}"
        );
        s.mark_published("r1", &fences, &ids, Marking::Claimed)
            .await
            .unwrap();
    }
    assert_eq!(b.status_of(second).await, "dead");
    // Skipping the second lets the rest go, the first included if it had not gone.
    assert_eq!(b.skip(&[second]).await, 1);
    let mut rest = Vec::new();
    for _ in 0..3 {
        let claimed = claim(s, &parts, 100).await;
        let ids: Vec<i64> = claimed.iter().map(|r| r.id).collect();
        rest.extend(claimed.iter().map(|r| r.aggregate_version.unwrap()));
        s.mark_published("r1", &fences, &ids, Marking::Claimed)
            .await
            .unwrap();
    }
    rest.retain(|v| *v != 1);
    assert_eq!(rest, vec![3, 4]);
    assert_eq!(b.status_of(first).await, "published");
}

async fn a_skip_with_nothing_behind_drops_the_hold_for_later_events(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 1)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let head = kill_head(s, &fences, "a").await;
    let later = Event::new("order", "a", "Changed").aggregate_version(2);
    assert_eq!(b.skip(&[head]).await, 1);
    b.enqueue(&[later]).await;
    assert_eq!(versions(s, &fences, "a").await, vec![2], "a flows again");
}

async fn replay_and_skip_leave_rows_that_are_not_dead_alone(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 2)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    let (first, second) = (rows[0].id, rows[1].id);
    assert_eq!(
        s.mark_published("r1", &fences, &[first], Marking::Claimed)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(b.replay(&[first, second, 999_999]).await, 0);
    assert_eq!(b.skip(&[first, second, 999_999]).await, 0);
    assert_eq!(b.status_of(first).await, "published");
    assert_eq!(b.status_of(second).await, "pending");
    assert_eq!(versions(s, &fences, "a").await, vec![2]);
}

/// Lag is how long an event has waited in the outbox, by the database's clock: a writer's
/// `occurred_at` far ahead (a skewed clock) or far behind (a backfill) does not move it.
async fn lag_counts_from_arrival_by_the_database_clock_not_the_writers_time(b: Backend) {
    let s = &b.store;
    assert_eq!(
        s.backlog().await.unwrap().oldest_age,
        None,
        "nothing pending, no age"
    );
    let now = chrono::Utc::now();
    b.enqueue(&[
        Event::new("order", "backfill", "Happened").occurred_at(now - chrono::Duration::hours(2))
    ])
    .await;
    let age = s
        .backlog()
        .await
        .unwrap()
        .oldest_age
        .expect("a pending row has an age");
    assert!(
        age < Duration::from_secs(600),
        "an event backfilled with a time two hours ago has not waited that long: {age:?}"
    );
    b.enqueue(&[
        Event::new("order", "ahead", "Happened").occurred_at(now + chrono::Duration::minutes(10))
    ])
    .await;
    if matches!(b.write, Writer::Model(_)) {
        // The model's clock is virtual: it does not move while this test waits.
        return;
    }
    // Only the row from ten minutes ahead left pending: its wait grows from its arrival.
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    let first = rows.iter().map(|r| r.id).min().unwrap();
    assert_eq!(
        s.mark_published("r1", &fences, &[first], Marking::Claimed)
            .await
            .unwrap()
            .len(),
        1
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let backlog = s.backlog().await.unwrap();
        assert_eq!(backlog.pending, 1);
        let age = backlog.oldest_age.expect("a pending row has an age");
        if age >= Duration::from_secs(1) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the wait of a row written with a time ahead does not grow: {age:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The one `mark_published` of both sources: a claimed batch releases the hold whose head it
/// marks (the rest of the aggregate is claimable at once); streamed events leave it (the CDC
/// table path gives the aggregate back once nothing of it is pending) and, on the stores with
/// a CDC source, report the ids settled before.
async fn a_streamed_mark_keeps_the_hold_a_claimed_one_releases_it(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 3)).await;
    b.enqueue(&events("b", 3)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let rows = claim(s, &parts, 100).await;
    let head = |key: &str| {
        rows.iter()
            .find(|r| r.aggregate_id == key)
            .map(|r| r.id)
            .unwrap()
    };
    let (a, bh) = (head("a"), head("b"));
    let failures: Vec<Failure> = [a, bh]
        .iter()
        .map(|&id| Failure {
            id,
            error: "transient: broker busy".into(),
            backoff: Duration::from_secs(3600),
            dead: false,
            permanent: false,
        })
        .collect();
    assert_eq!(
        s.mark_failed("r1", &fences, &failures, true).await.unwrap(),
        2
    );
    assert!(claim(s, &parts, 100).await.is_empty(), "both held");

    let streamed = s
        .mark_published("r1", &fences, &[a], Marking::Streamed)
        .await
        .unwrap();
    assert_eq!(streamed, vec![a]);
    assert!(
        claim(s, &parts, 100).await.is_empty(),
        "a streamed mark leaves the hold"
    );
    let claimed = s
        .mark_published("r1", &fences, &[bh], Marking::Claimed)
        .await
        .unwrap();
    assert_eq!(claimed, vec![bh]);
    let free: Vec<String> = claim(s, &parts, 100)
        .await
        .into_iter()
        .map(|r| r.aggregate_id)
        .collect();
    assert_eq!(free, ["b", "b"], "a claimed mark releases the hold");

    // Marked again: settled before. Reported by a streamed mark where a CDC source reads it.
    let again = s
        .mark_published("r1", &fences, &[a], Marking::Streamed)
        .await
        .unwrap();
    let reports_settled = matches!(b.write, Writer::Pg(_) | Writer::Model(_));
    assert_eq!(again, if reports_settled { vec![a] } else { vec![] });
    assert!(s
        .mark_published("r1", &fences, &[a], Marking::Claimed)
        .await
        .unwrap()
        .is_empty());
}

/// A broker's error text is stored whatever it holds: a NUL character (which PostgreSQL's text
/// refuses) or 100 kB (more than MySQL's `TEXT` takes) made the failure unrecordable, so the
/// event was published again for ever and never dead-lettered.
async fn any_broker_error_text_is_recorded(b: Backend) {
    let s = &b.store;
    b.enqueue(&events("a", 1)).await;
    let fences = s.acquire("r1", 100, TTL).await.unwrap();
    let parts: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let row = claim(s, &parts, 100).await.remove(0);
    let policy = outbox_relayer::retry::RetryPolicy {
        max_attempts: 1,
        ..Default::default()
    };
    let text = format!("broker said \0{}", "é".repeat(50_000));
    let failure = policy.failure(
        row.id,
        row.attempts,
        row.permanent_failures,
        &outbox_relayer::PublishError::permanent(text),
    );
    assert!(failure.dead);
    assert!(!failure.error.contains('\0'));
    assert!(failure.error.len() <= outbox_relayer::store::MAX_ERROR_TEXT);
    assert_eq!(
        s.mark_failed("r1", &fences, &[failure], true)
            .await
            .unwrap(),
        1
    );
    assert_eq!(b.status_of(row.id).await, "dead");
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(#[tokio::test]
            async fn $name() { super::$name(super::Backend::postgres().await).await })*
        }
        mod mysql {
            $(#[tokio::test]
            async fn $name() { super::$name(super::Backend::mysql().await).await })*
        }
        mod sqlite {
            $(#[tokio::test]
            async fn $name() { super::$name(super::Backend::sqlite().await).await })*
        }
        mod simulation_model {
            $(#[tokio::test]
            async fn $name() { super::$name(super::Backend::model()).await })*
        }
    };
}

conformance!(
    leases_are_exclusive_fenced_and_handed_over,
    claims_pending_rows_in_order_and_marks_them_fenced,
    failures_hold_park_or_skip_the_aggregate,
    oversized_payloads_are_not_loaded,
    a_floor_starts_the_scan_and_zero_scans_everything,
    a_pending_row_below_the_floor_holds_back_its_aggregate,
    a_claim_stops_at_its_byte_budget_and_always_takes_one_row,
    transient_failures_leave_the_permanent_budget_alone,
    a_held_aggregate_waits_and_comes_back_whole_and_in_order_when_due,
    a_parked_aggregate_waits_and_a_dead_head_that_skips_lets_its_rest_go,
    a_replayed_dead_head_resumes_its_aggregate_from_it_in_order,
    a_skipped_dead_head_stays_dead_and_lets_the_rest_go_in_order,
    a_skip_with_nothing_behind_drops_the_hold_for_later_events,
    a_replay_before_another_dead_letter_leaves_its_park_in_place,
    a_replay_of_both_dead_letters_resumes_the_aggregate_in_order,
    a_dead_letter_that_never_parked_is_not_replayed_before_a_park,
    a_replay_after_the_parked_event_waits_behind_it,
    a_failure_before_the_parked_event_leaves_the_park_in_place,
    replay_and_skip_leave_rows_that_are_not_dead_alone,
    lag_counts_from_arrival_by_the_database_clock_not_the_writers_time,
    a_streamed_mark_keeps_the_hold_a_claimed_one_releases_it,
    any_broker_error_text_is_recorded,
);

/// MySQL's `enqueued_at` takes NULL (it was added without copying the table): a row a writer
/// gives an explicit NULL still counts in the lag, from its `occurred_at`, instead of hiding.
#[tokio::test]
async fn mysql_a_row_written_without_an_arrival_time_still_counts_in_the_lag() {
    let b = Backend::mysql().await;
    let Writer::MySql(db) = &b.write else {
        unreachable!("a MySQL backend")
    };
    sqlx::query(&db.tables.render_mysql(
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload, \
         occurred_at, enqueued_at) \
         VALUES (UUID(), 'order', '1', 'Placed', '{}', UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, NULL)",
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let backlog = b.store.backlog().await.unwrap();
    assert_eq!(backlog.pending, 1);
    let age = backlog.oldest_age.expect("the row counts");
    assert!(age >= Duration::from_secs(3000), "{age:?}");
}
