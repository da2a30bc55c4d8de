//! The lease rows are locked in partition order by every statement that locks several of them,
//! on PostgreSQL: a mark (its fence, FOR SHARE) and a renewal (FOR UPDATE) that lock in
//! different orders deadlock, and the deadlock detector answers only after `deadlock_timeout`
//! (1 s): the bench saw deliveries stall for a second.

use std::{str::FromStr, time::Duration};

use outbox::{Event, Outbox};
use outbox_relayer::{
    postgres::PgStore,
    store::{Fence, Marking},
};
use outbox_testkit::{wait_until, TestDb};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    Connection, PgConnection,
};

/// A session whose plans walk the batch's partitions in the order given (a nested loop over
/// them, the lease rows by index), as PostgreSQL may plan it on a table of another size: a
/// statement that locks in its plan's order then locks in the relay's order.
fn nested_loops(url: &str) -> PgConnectOptions {
    PgConnectOptions::from_str(url).unwrap().options([
        ("enable_hashjoin", "off"),
        ("enable_mergejoin", "off"),
        ("enable_seqscan", "off"),
        ("enable_sort", "off"),
    ])
}

/// One event in an outbox of eight partitions, every lease held by `r1`; the fences in the
/// order the relay rotates them (not partition order); and another transaction holding the
/// lowest partition's lease row (a takeover, say), on a connection of its own: closing it ends
/// the transaction if the test fails.
struct Scene {
    db: TestDb,
    id: i64,
    fences: Vec<Fence>,
    other: PgConnection,
}

impl Scene {
    async fn new() -> Self {
        let db = TestDb::new(8).await;
        let mut tx = db.pool.begin().await.unwrap();
        db.outbox()
            .enqueue(&mut tx, &Event::new("order", "a", "Placed"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let id: i64 = sqlx::query_scalar(&db.tables.render("SELECT id FROM {schema}.{events}"))
            .fetch_one(&db.pool)
            .await
            .unwrap();
        let mut fences = db_store(&db)
            .await
            .acquire("r1", 8, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(fences.len(), 8);
        fences.sort_by_key(|f| std::cmp::Reverse(f.0));
        let mut other = PgConnection::connect(&db.url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut other).await.unwrap();
        sqlx::query(
            &db.tables
                .render("SELECT 1 FROM {schema}.leases WHERE partition = 0 FOR UPDATE"),
        )
        .execute(&mut other)
        .await
        .unwrap();
        Self {
            db,
            id,
            fences,
            other,
        }
    }

    /// The fences of every partition but the lowest.
    fn rest(&self) -> Vec<Fence> {
        self.fences.iter().copied().filter(|f| f.0 != 0).collect()
    }

    /// A store on a session of its own, named `app`, planning with nested loops.
    async fn session(&self, app: &str) -> PgStore {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(nested_loops(&self.db.url).application_name(app))
            .await
            .unwrap();
        PgStore::open(pool, &self.db.tables).await.unwrap()
    }

    /// Waits until the session named `app` waits on a lock.
    async fn waiting(&self, app: &str, what: &str) {
        wait_until(what, Duration::from_secs(30), || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                 WHERE application_name = $1 AND wait_event_type = 'Lock')",
            )
            .bind(app)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
        })
        .await;
    }

    /// Ends the other transaction: the lowest lease row is free.
    async fn free_the_lowest(&mut self) {
        sqlx::query("COMMIT")
            .execute(&mut self.other)
            .await
            .unwrap();
    }
}

async fn db_store(db: &TestDb) -> PgStore {
    PgStore::open(db.pool.clone(), &db.tables).await.unwrap()
}

#[tokio::test]
async fn a_mark_waiting_on_one_lease_holds_no_later_one() {
    let mut scene = Scene::new().await;
    let app = format!("lock-order-{}", scene.db.schema);
    let marker = scene.session(&app).await;
    let (fences, id) = (scene.fences.clone(), scene.id);
    let mark = tokio::spawn(async move {
        marker
            .mark_published("r1", &fences, &[id], Marking::Claimed)
            .await
    });
    scene
        .waiting(&app, "the mark to wait on the lease row")
        .await;

    // A renewal of the other partitions is not held up by the waiting mark: it locked none of
    // them before the lowest. Before, the mark held the leases it met first, and a renewal
    // of them waited for it (with a renewal holding the lowest, a deadlock).
    let (store, rest) = (db_store(&scene.db).await, scene.rest());
    let renew =
        tokio::spawn(async move { store.renew("r1", &rest, Duration::from_secs(60)).await });
    wait_until(
        "the renewal to pass the waiting mark",
        Duration::from_secs(10),
        || async { renew.is_finished() },
    )
    .await;
    assert_eq!(renew.await.unwrap().unwrap().len(), 7);
    scene.free_the_lowest().await;
    assert_eq!(
        mark.await.unwrap().unwrap(),
        vec![id],
        "the mark goes on once the row is free"
    );
}

#[tokio::test]
async fn a_renewal_waiting_on_one_lease_holds_no_later_one() {
    let mut scene = Scene::new().await;
    let app = format!("lock-order-renew-{}", scene.db.schema);
    let renewer = scene.session(&app).await;
    let fences = scene.fences.clone();
    let renew =
        tokio::spawn(async move { renewer.renew("r1", &fences, Duration::from_secs(60)).await });
    scene
        .waiting(&app, "the renewal to wait on the lease row")
        .await;

    // A mark under the other partitions is not held up by the waiting renewal.
    let (store, rest, id) = (db_store(&scene.db).await, scene.rest(), scene.id);
    let mark = tokio::spawn(async move {
        store
            .mark_published("r1", &rest, &[id], Marking::Claimed)
            .await
    });
    wait_until(
        "the mark to pass the waiting renewal",
        Duration::from_secs(10),
        || async { mark.is_finished() },
    )
    .await;
    mark.await.unwrap().unwrap();
    scene.free_the_lowest().await;
    assert_eq!(renew.await.unwrap().unwrap().len(), 8);
}
