//! The MySQL / MariaDB outbox next to the application that shares its tables (the machine's
//! MariaDB): the relay and the operator commands never make an application insert wait, never
//! let one lease statement hold up another, keep keys byte for byte, and set their own session
//! whatever the server's defaults.
//!
//! Each "frozen" party below is a transaction left open half-way, as a relay stopped by
//! SIGSTOP or cut off by the network would leave it; the test then checks that the others go
//! on, on connections with the server's defaults (REPEATABLE READ) as an application's are.

use std::time::Duration;

use outbox::{
    mysql::{MySqlInbox, MySqlOutbox, Session},
    Event, Inbox, Outbox, Seen,
};
use outbox_relayer::{
    admin::Admin,
    mysql::{MySqlStore, DATETIME_OF_MS, NOW_MS},
    store::{Failure, Fence, Marking, Store},
};
use outbox_testkit::{wait_until, MySqlDb};
use sqlx::{Connection, MySqlConnection};

const DAY: Duration = Duration::from_secs(86_400);
const LONG: Duration = Duration::from_secs(60);

/// A connection with the server's defaults (REPEATABLE READ), as the application's, waiting at
/// most a second for a row lock: a wait shows as error 1205 instead of a slow test.
async fn application(db: &MySqlDb) -> MySqlConnection {
    let mut conn = MySqlConnection::connect(&db.url).await.unwrap();
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

/// Waits until a statement in the test's database has run for half a second (on tables of a
/// few rows: it waits for a lock), or `over` says the party that was to wait is done.
/// `innodb_trx` does not list a READ COMMITTED transaction waiting for its first lock on
/// MariaDB 10.11, so the process list tells.
async fn someone_waits(db: &MySqlDb, what: &str, over: impl Fn() -> bool) {
    wait_until(what, Duration::from_secs(30), || async {
        over()
            || sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM information_schema.processlist
                 WHERE db = ? AND command IN ('Query', 'Execute') AND time_ms > 500
                   AND id <> CONNECTION_ID())",
            )
            .bind(&db.database)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    })
    .await;
}

async fn ids(db: &MySqlDb) -> Vec<i64> {
    sqlx::query_scalar(
        &db.tables
            .render_mysql("SELECT id FROM {events} ORDER BY id"),
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Writes one event in the application's open transaction on `conn`.
async fn insert_in(conn: &mut MySqlConnection, db: &MySqlDb, event: &Event) -> Result<(), String> {
    MySqlOutbox::new(db.tables.clone())
        .enqueue(conn, event)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A purge batch waiting on one of its rows (another transaction holds it) holds no lock an
/// application insert waits on. Before, its locking read in `published_at` order held a
/// next-key lock on the first published entry, the gap every new pending row's entry goes
/// into: the insert waited for the batch, here until its lock wait timeout.
async fn a_waiting_purge_lets_the_application_insert(archive: bool) {
    let db = MySqlDb::new(4).await;
    let old: Vec<Event> = (0..20)
        .map(|i| Event::new("order", format!("old-{i}"), "Placed"))
        .collect();
    db.enqueue(&old).await;
    db.exec(
        "UPDATE {events} SET status = 'published', \
         published_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY",
    )
    .await;
    let second = ids(&db).await[1];
    let mut other = MySqlConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query(
        &db.tables
            .render_mysql("SELECT id FROM {events} WHERE id = ? FOR UPDATE"),
    )
    .bind(second)
    .execute(&mut other)
    .await
    .unwrap();

    let admin = Admin::mysql(db.pool.clone(), &db.tables);
    let purge = tokio::spawn(async move { admin.purge(DAY, 100, archive, |_| {}).await });
    someone_waits(&db, "the purge to wait on the row held", || {
        purge.is_finished()
    })
    .await;
    assert!(
        !purge.is_finished(),
        "the purge ended at once: {:?}",
        purge.await
    );

    let mut app = application(&db).await;
    sqlx::query("BEGIN").execute(&mut app).await.unwrap();
    let inserted = insert_in(&mut app, &db, &Event::new("order", "new", "Placed")).await;
    sqlx::query("COMMIT").execute(&mut app).await.unwrap();
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    assert_eq!(
        inserted,
        Ok(()),
        "the application's insert waited for the purge"
    );
    assert_eq!(purge.await.unwrap().unwrap(), 20);
    assert_eq!(db.count("pending").await, 1, "the new row is kept");
    assert_eq!(db.count("published").await, 0);
    let archived: i64 = sqlx::query_scalar(
        &db.tables
            .render_mysql("SELECT count(*) FROM {events}_archive"),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(archived, if archive { 20 } else { 0 });
}

#[tokio::test]
async fn a_waiting_purge_lets_the_application_insert_without_archive() {
    a_waiting_purge_lets_the_application_insert(false).await;
}

#[tokio::test]
async fn a_waiting_purge_lets_the_application_insert_with_archive() {
    a_waiting_purge_lets_the_application_insert(true).await;
}

/// The inbox purge deletes by primary key: a consumer's insert does not wait for it.
#[tokio::test]
async fn an_inbox_purge_deletes_only_what_it_read() {
    let db = MySqlDb::new(1).await;
    let inbox = MySqlInbox::new(&db.tables);
    let mut conn = db.pool.acquire().await.unwrap();
    for i in 0..30 {
        inbox
            .record_message(&mut conn, "c", &format!("m-{i}"), None)
            .await
            .unwrap();
    }
    db.exec("UPDATE {inbox} SET processed_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY")
        .await;
    inbox
        .record_message(&mut conn, "c", "fresh", None)
        .await
        .unwrap();
    drop(conn);
    assert_eq!(inbox.purge(&db.pool, DAY, 7).await.unwrap(), 30);
    let left: Vec<Vec<u8>> =
        sqlx::query_scalar(&db.tables.render_mysql("SELECT event_id FROM {inbox}"))
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(left, vec![b"fresh".to_vec()]);
}

/// A relay frozen half-way through taking leases holds no lock on another relay's live lease:
/// the other relay's renewal goes through. Before, the free-lease scan (no index on owner or
/// expiry) kept an exclusive lock on every row it passed, live leases included.
#[tokio::test]
async fn a_relay_frozen_while_taking_leases_holds_no_live_lease() {
    let db = MySqlDb::new(8).await;
    let store = MySqlStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let live = store.acquire("r1", 4, LONG).await.unwrap();
    assert_eq!(live.len(), 4);

    let mut frozen = MySqlConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut frozen).await.unwrap();
    let taken = store.acquire_on(&mut frozen, "r2", 8, LONG).await.unwrap();
    assert_eq!(taken.len(), 4, "r2 takes the four free leases");

    let renewer = store.clone();
    let held = live.clone();
    let renew = tokio::spawn(async move { renewer.renew("r1", &held, LONG).await });
    wait_until(
        "r1's renewal to pass r2's open acquire",
        Duration::from_secs(10),
        || async { renew.is_finished() },
    )
    .await;
    assert_eq!(renew.await.unwrap().unwrap().len(), 4);
    // A third relay finds nothing free and does not wait either.
    assert!(store.acquire("r3", 8, LONG).await.unwrap().is_empty());
    sqlx::query("ROLLBACK").execute(&mut frozen).await.unwrap();
}

/// A relay's write of event state does not wait for an application transaction still open on
/// the same aggregate. Before (REPEATABLE READ), setting the aggregate's later rows waiting
/// scanned its index range with locks and waited for the uncommitted insert: the relay's mark
/// hung behind the application for the server's 50 s lock wait, its lease row share-locked.
/// Order still holds: the row committed later waits behind the aggregate's hold.
#[tokio::test]
async fn an_open_application_transaction_does_not_stall_the_relay() {
    let db = MySqlDb::new(1).await;
    db.enqueue(&[Event::new("order", "x", "Placed")]).await;
    let store = MySqlStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let fences = store.acquire("r1", 1, LONG).await.unwrap();
    let floors: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let claimed = store.claim(&floors, 10, 1 << 20, 1 << 20).await.unwrap();
    assert_eq!(claimed.rows.len(), 1);
    let first = claimed.rows[0].id;

    let mut app = application(&db).await;
    sqlx::query("BEGIN").execute(&mut app).await.unwrap();
    insert_in(&mut app, &db, &Event::new("order", "x", "Shipped"))
        .await
        .unwrap();
    let failure = Failure {
        id: first,
        error: "broker down".into(),
        backoff: LONG,
        dead: false,
        permanent: false,
    };
    let marked = tokio::time::timeout(
        Duration::from_secs(20),
        store.mark_failed("r1", &fences, std::slice::from_ref(&failure), true),
    )
    .await
    .expect("the relay's mark waited for the application's transaction");
    assert_eq!(marked.unwrap(), 1);
    sqlx::query("COMMIT").execute(&mut app).await.unwrap();

    // The row committed after the hold comes back behind it, not ahead of its head.
    let again = store.claim(&floors, 10, 1 << 20, 1 << 20).await.unwrap();
    assert!(again.rows.is_empty(), "{:?}", again.rows);
}

/// Lease rows are locked in partition order by the mark's fence, the renewal and the release:
/// a mark waiting on the lowest lease row holds none above it, so a renewal of those passes.
/// Before, the mark locked them in the relay's rotated order and a renewal in sorted order: a
/// deadlock whose victim, when it was the renewal, cost the relay its leases.
#[tokio::test]
async fn a_mark_waiting_on_one_lease_holds_no_later_one() {
    let db = MySqlDb::new(8).await;
    db.enqueue(&[Event::new("order", "a", "Placed")]).await;
    let id = ids(&db).await[0];
    let store = MySqlStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let mut fences: Vec<Fence> = store.acquire("r1", 8, LONG).await.unwrap();
    fences.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut other = MySqlConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query(
        &db.tables
            .render_mysql("SELECT `partition` FROM {leases} WHERE `partition` = 0 FOR UPDATE"),
    )
    .execute(&mut other)
    .await
    .unwrap();

    let patient = Session {
        lock_wait: LONG,
        ..Session::default()
    };
    let marker = MySqlStore::open_with(db.pool.clone(), &db.tables, patient)
        .await
        .unwrap();
    let all = fences.clone();
    let mark = tokio::spawn(async move {
        marker
            .mark_published("r1", &all, &[id], Marking::Claimed)
            .await
    });
    someone_waits(&db, "the mark to wait on the lowest lease row", || {
        mark.is_finished()
    })
    .await;
    assert!(
        !mark.is_finished(),
        "the mark ended at once: {:?}",
        mark.await
    );

    let rest: Vec<Fence> = fences.iter().copied().filter(|f| f.0 != 0).collect();
    let renewer = store.clone();
    let renew = tokio::spawn(async move { renewer.renew("r1", &rest, LONG).await });
    wait_until(
        "the renewal to pass the waiting mark",
        Duration::from_secs(10),
        || async { renew.is_finished() },
    )
    .await;
    assert_eq!(renew.await.unwrap().unwrap().len(), 7);
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    assert_eq!(mark.await.unwrap().unwrap(), vec![id]);
}

/// Keys compare byte for byte, trailing spaces included: two aggregates, two inbox messages.
/// Before, `utf8mb4_bin` (PAD SPACE) made 'a' and 'a ' one key: the second event's version
/// was refused as a duplicate, and the inbox skipped 'msg-1 ' as a duplicate of 'msg-1'.
#[tokio::test]
async fn keys_differing_by_a_trailing_space_are_two_keys() {
    let db = MySqlDb::new(8).await;
    db.enqueue(&[
        Event::new("order", "a", "Placed").aggregate_version(1),
        Event::new("order", "a ", "Placed").aggregate_version(1),
    ])
    .await;
    assert_eq!(db.count("pending").await, 2);

    let inbox = MySqlInbox::new(&db.tables);
    let mut conn = db.pool.acquire().await.unwrap();
    let first = inbox.record_message(&mut conn, "c", "msg-1", None).await;
    let second = inbox.record_message(&mut conn, "c", "msg-1 ", None).await;
    assert_eq!((first.unwrap(), second.unwrap()), (Seen::New, Seen::New));

    // A hold on 'a' does not hold 'a ' back.
    let store = MySqlStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let fences = store.acquire("r1", 8, LONG).await.unwrap();
    let floors: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let claimed = store.claim(&floors, 10, 1 << 20, 1 << 20).await.unwrap();
    let a = claimed.rows.iter().find(|r| r.aggregate_id == "a").unwrap();
    let failure = Failure {
        id: a.id,
        error: "broker down".into(),
        backoff: LONG,
        dead: false,
        permanent: false,
    };
    store
        .mark_failed("r1", &fences, &[failure], true)
        .await
        .unwrap();
    let spaced = claimed
        .rows
        .iter()
        .find(|r| r.aggregate_id == "a ")
        .unwrap();
    let marked = store
        .mark_published("r1", &fences, &[spaced.id], Marking::Claimed)
        .await
        .unwrap();
    assert_eq!(marked, vec![spaced.id]);
}

/// The key columns use the server's NO PAD binary collation after `migrate`, and every
/// migration runs again after one cut short between its change and its record. Before, 0002
/// failed when run again (duplicate column `event_type`).
#[tokio::test]
async fn migrations_leave_byte_exact_keys_and_run_again() {
    let db = MySqlDb::new(2).await;
    let collations: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT table_name, column_name, collation_name FROM information_schema.columns
         WHERE table_schema = ? AND column_name IN ('aggregate_type', 'aggregate_id', 'consumer')
         ORDER BY table_name, column_name",
    )
    .bind(&db.database)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(collations.len(), 7, "{collations:?}");
    for (table, column, collation) in &collations {
        assert!(
            matches!(collation.as_str(), "utf8mb4_nopad_bin" | "utf8mb4_0900_bin"),
            "{table}.{column} has {collation}"
        );
    }
    // Cut short after their changes, before their records.
    db.exec("DELETE FROM {migrations} WHERE version IN (2, 3, 4)")
        .await;
    MySqlOutbox::new(db.tables.clone())
        .migrate(&db.pool, Default::default())
        .await
        .expect("the migrations run again");
    // A database migrated by an earlier build recorded 0002's earlier text.
    db.exec("UPDATE {migrations} SET checksum = '2891bd0cd67c407f' WHERE version = 2")
        .await;
    MySqlOutbox::new(db.tables.clone())
        .migrate(&db.pool, Default::default())
        .await
        .expect("0002's earlier text is accepted");
    // The CHECK constraints survive the collation change.
    let empty = sqlx::query(&db.tables.render_mysql(
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES (UUID(), 'order', '', 'Placed', '{}')",
    ))
    .execute(&db.pool)
    .await;
    assert!(empty.is_err(), "an empty aggregate id is refused");
}

/// The relay's connections run READ COMMITTED with autocommit on and its timeouts, whatever
/// the server's defaults (REPEATABLE READ here; a server set to READ UNCOMMITTED would let
/// the claim publish rows rolled back later). Before, they ran with the server's.
#[tokio::test]
async fn the_relay_sets_its_own_session() {
    let db = MySqlDb::new(1).await;
    let session = Session {
        lock_wait: Duration::from_secs(3),
        statement: Duration::from_secs(30),
    };
    let store = MySqlStore::open_with(db.pool.clone(), &db.tables, session)
        .await
        .unwrap();
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let isolation = if outbox::mysql::is_mariadb(&version) {
        "@@tx_isolation"
    } else {
        "@@transaction_isolation"
    };
    let (level, autocommit, lock_wait, zone): (String, i64, u64, String) = sqlx::query_as(
        &format!("SELECT {isolation}, @@autocommit, @@innodb_lock_wait_timeout, @@time_zone"),
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(
        (level.as_str(), autocommit, lock_wait, zone.as_str()),
        ("READ-COMMITTED", 1, 3, "+00:00")
    );
    if outbox::mysql::is_mariadb(&version) {
        let (threshold, limit): (u64, f64) =
            sqlx::query_as("SELECT @@in_predicate_conversion_threshold, @@max_statement_time")
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!((threshold, limit), (0, 30.0));
    }
    // The application's own connections keep the server's defaults.
    let theirs: String = sqlx::query_scalar(&format!("SELECT {isolation}"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(theirs, "REPEATABLE-READ");
}

/// The relay's clock and hold times hold past 2038: MariaDB before 11.5 answers
/// `UNIX_TIMESTAMP()` and `FROM_UNIXTIME()` with NULL after 2038-01-19, and every lease
/// statement and claim then failed.
#[tokio::test]
async fn the_clock_holds_past_2038() {
    let db = MySqlDb::new(1).await;
    let in_2040 = NOW_MS.replace("UTC_TIMESTAMP(6)", "TIMESTAMP'2040-01-01 00:00:00.250'");
    let ms: Option<i64> = sqlx::query_scalar(&format!("SELECT {in_2040}"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(ms, Some(2_208_988_800_250));
    let at: Option<String> = sqlx::query_scalar(&format!("SELECT CAST({DATETIME_OF_MS} AS CHAR)"))
        .bind(2_208_988_800_250_i64)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(at.as_deref(), Some("2040-01-01 00:00:00.250000"));
    for (file, sql) in [
        ("store", include_str!("../src/mysql/sql/store.sql")),
        ("admin", include_str!("../src/mysql/sql/admin.sql")),
    ] {
        assert!(
            !sql.contains("UNIX_TIMESTAMP(") && !sql.contains("FROM_UNIXTIME("),
            "{file} statements use 32-bit time"
        );
    }
}

/// One UUID has one spelling: a row whose event id is the same UUID without hyphens is
/// dead-lettered with the reason, never published as a second event. Capitals are the same
/// spelling (the event id's unique key ignores case): such a row is published, its id read as
/// the UUID it is.
#[tokio::test]
async fn an_event_id_in_another_spelling_is_unreadable() {
    let db = MySqlDb::new(1).await;
    let (id, other) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    for (key, spelling) in [
        ("a", id.hyphenated().to_string()),
        ("b", id.simple().to_string()),
        ("c", other.hyphenated().to_string().to_uppercase()),
    ] {
        sqlx::query(&db.tables.render_mysql(
            "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES (?, 'order', ?, 'Placed', '{}')",
        ))
        .bind(spelling)
        .bind(key)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let store = MySqlStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let fences = store.acquire("r1", 1, LONG).await.unwrap();
    let floors: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let claimed = store.claim(&floors, 10, 1 << 20, 1 << 20).await.unwrap();
    let unreadable: Vec<(&str, bool)> = claimed
        .rows
        .iter()
        .map(|r| {
            let why = r.unreadable.as_deref().unwrap_or("");
            (r.aggregate_id.as_str(), why.contains("one spelling"))
        })
        .collect();
    assert_eq!(unreadable, [("a", false), ("b", true), ("c", false)]);
    assert_eq!(claimed.rows[2].event_id, other);
}

/// On a server that logs statements to its binary log, the relay's READ COMMITTED session
/// logs rows instead: before, InnoDB refused every write of the relay (error 1665), no lease
/// was ever taken and nothing was published.
#[tokio::test]
async fn the_relay_writes_on_a_server_logging_statements() {
    let server = outbox_testkit::PrivateMariaDb::start_with(&[
        "--log-bin=mariadb-bin",
        "--binlog-format=STATEMENT",
        "--server-id=1",
    ])
    .await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(4)
        .connect(&server.url())
        .await
        .unwrap();
    let tables = outbox::Tables::default();
    MySqlOutbox::new(tables.clone())
        .migrate(&pool, Default::default())
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    MySqlOutbox::new(tables.clone())
        .enqueue(&mut tx, &Event::new("order", "a", "Placed"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let store = MySqlStore::open(pool.clone(), &tables).await.unwrap();
    let fences = store.acquire("r1", 32, LONG).await.unwrap();
    assert_eq!(fences.len(), 32);
    let floors: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    let claimed = store.claim(&floors, 10, 1 << 20, 1 << 20).await.unwrap();
    let ids: Vec<i64> = claimed.rows.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), 1);
    let marked = store
        .mark_published("r1", &fences, &ids, Marking::Claimed)
        .await
        .unwrap();
    assert_eq!(marked, ids);
}

/// A hold written under the old collation whose key is not its head row's (the upsert of
/// 'a ' met the hold of 'a') is given back to the head row's aggregate by migration 0004.
/// Before, it held neither: never due, and a skip could not find it.
#[tokio::test]
async fn migration_0004_gives_each_hold_its_head_rows_key() {
    let db = MySqlDb::new(1).await;
    db.enqueue(&[
        Event::new("order", "a", "Placed"),
        Event::new("order", "a ", "Placed"),
    ])
    .await;
    let rows = ids(&db).await;
    db.exec(&format!(
        "UPDATE {{events}} SET status = 'dead' WHERE id = {dead};
         INSERT INTO {{holds}} (aggregate_type, aggregate_id, `partition`, event_id, held_until,
                               created_at)
         VALUES ('order', 'a', 0, {dead}, NULL, 0);
         DELETE FROM {{migrations}} WHERE version = 4",
        dead = rows[1]
    ))
    .await;
    MySqlOutbox::new(db.tables.clone())
        .migrate(&db.pool, Default::default())
        .await
        .unwrap();
    let holds: Vec<(Vec<u8>, i64)> = sqlx::query_as(
        &db.tables
            .render_mysql("SELECT aggregate_id, event_id FROM {holds} ORDER BY event_id"),
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(holds, vec![(b"a ".to_vec(), rows[1])]);
}

/// A migration waiting for a transaction still open on the events table (a report, a dump)
/// gives way every two seconds instead of queueing the application's inserts behind it until
/// that transaction ends, and completes once it has.
#[tokio::test]
async fn a_migration_waiting_on_a_reader_lets_the_application_insert() {
    let db = MySqlDb::new(1).await;
    // The events table back at the collation migration 0004 changes.
    db.exec(
        "ALTER TABLE {events} \
         MODIFY aggregate_type VARCHAR(255) COLLATE utf8mb4_bin NOT NULL \
         CHECK (aggregate_type <> ''), \
         MODIFY aggregate_id VARCHAR(255) COLLATE utf8mb4_bin NOT NULL \
         CHECK (aggregate_id <> '');
         DELETE FROM {migrations} WHERE version = 4",
    )
    .await;
    let mut reader = MySqlConnection::connect(&db.url).await.unwrap();
    sqlx::query("START TRANSACTION")
        .execute(&mut reader)
        .await
        .unwrap();
    sqlx::query(&db.tables.render_mysql("SELECT count(*) FROM {events}"))
        .execute(&mut reader)
        .await
        .unwrap();
    let (pool, tables) = (db.pool.clone(), db.tables.clone());
    let migrate = tokio::spawn(async move {
        MySqlOutbox::new(tables)
            .migrate(&pool, Default::default())
            .await
    });
    someone_waits(&db, "the migration to wait for the reader", || {
        migrate.is_finished()
    })
    .await;
    let mut app = MySqlConnection::connect(&db.url).await.unwrap();
    let inserted = tokio::time::timeout(
        Duration::from_secs(20),
        insert_in(&mut app, &db, &Event::new("order", "b", "Placed")),
    )
    .await
    .expect("the application's insert queued behind the migration");
    assert_eq!(inserted, Ok(()));
    sqlx::query("COMMIT").execute(&mut reader).await.unwrap();
    migrate.await.unwrap().expect("the migration completes");
    let collation: String = sqlx::query_scalar(
        "SELECT collation_name FROM information_schema.columns
         WHERE table_schema = ? AND table_name = 'outbox_events' AND column_name = 'aggregate_id'",
    )
    .bind(&db.database)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_ne!(collation, "utf8mb4_bin");
}
