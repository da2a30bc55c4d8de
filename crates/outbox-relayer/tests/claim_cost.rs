//! What a claim costs when an aggregate waits behind a hold with a long backlog (PostgreSQL):
//! the claim reads O(batch) rows, not the backlog, and the waiting rows come back in order when
//! the hold goes, whichever way it goes (published head, operator skip, a hold deleted by hand
//! and repaired by the safety net).

use std::time::Duration;

use outbox::{Event, Outbox};
use outbox_relayer::{
    admin::Admin,
    postgres::PgStore,
    store::{Failure, Marking, Store},
};
use outbox_testkit::TestDb;
use sqlx::Executor;

const TTL: Duration = Duration::from_secs(60);
const MAX: usize = 1 << 20;

async fn write(db: &TestDb, aggregate: &str, versions: std::ops::Range<i64>) {
    let events: Vec<Event> = versions
        .map(|v| Event::new("order", aggregate, "Happened").aggregate_version(v))
        .collect();
    for chunk in events.chunks(5_000) {
        let mut tx = db.pool.begin().await.unwrap();
        db.outbox().enqueue_batch(&mut tx, chunk).await.unwrap();
        tx.commit().await.unwrap();
    }
}

/// Rows of the events table that one execution of the claim visited (returned by a scan
/// node, or read and filtered out), from `EXPLAIN (ANALYZE, FORMAT JSON)`.
async fn rows_visited_by_a_claim(db: &TestDb, store: &PgStore, partitions: &[i32]) -> f64 {
    let mut conn = db.pool.acquire().await.unwrap();
    let name = format!("claim_{}", outbox_testkit::unique("p"));
    conn.execute(sqlx::raw_sql(&format!(
        "PREPARE {name}(integer[], bigint, integer, bigint[], bigint) AS {}",
        store.claim_statement()
    )))
    .await
    .unwrap();
    let parts: Vec<String> = partitions.iter().map(i32::to_string).collect();
    let floors: Vec<&str> = partitions.iter().map(|_| "0").collect();
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}('{{{}}}', 100, {MAX}, '{{{}}}', {})",
        parts.join(","),
        floors.join(","),
        i64::MAX
    ))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    conn.execute(sqlx::raw_sql(&format!("DEALLOCATE {name}")))
        .await
        .unwrap();
    fn visit(node: &serde_json::Value, table: &str) -> f64 {
        let here = if node["Relation Name"] == table {
            let loops = node["Actual Loops"].as_f64().unwrap_or(1.0);
            let rows = node["Actual Rows"].as_f64().unwrap_or(0.0);
            let removed = node["Rows Removed by Filter"].as_f64().unwrap_or(0.0)
                + node["Rows Removed by Index Recheck"]
                    .as_f64()
                    .unwrap_or(0.0);
            (rows + removed) * loops
        } else {
            0.0
        };
        here + node["Plans"]
            .as_array()
            .map_or(0.0, |plans| plans.iter().map(|p| visit(p, table)).sum())
    }
    if std::env::var_os("CLAIM_PLAN").is_some() {
        eprintln!("{}", serde_json::to_string_pretty(&plan).unwrap());
    }
    visit(&plan[0]["Plan"], db.tables.events().as_str())
}

fn dead(id: i64) -> Failure {
    Failure {
        id,
        error: "permanent: rejected".into(),
        backoff: Duration::ZERO,
        dead: true,
        permanent: true,
    }
}

#[tokio::test]
async fn a_claim_reads_its_batch_not_the_backlog_of_a_parked_aggregate() {
    let db = TestDb::new(1).await;
    write(&db, "hot", 1..20_001).await;
    let store = PgStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let fences = store.acquire("r1", 1, TTL).await.unwrap();
    let parts = [(0, 0)];
    let head = store.claim(&parts, 1, MAX, i64::MAX).await.unwrap().rows[0].id;
    assert_eq!(
        store
            .mark_failed("r1", &fences, &[dead(head)], true)
            .await
            .unwrap(),
        1
    );
    // Parked, 19,999 events behind its head; 10 others arrive, then 2,000 more of the
    // parked aggregate.
    for i in 0..10 {
        write(&db, &format!("cold{i}"), 1..2).await;
    }
    write(&db, "hot", 20_001..22_001).await;
    // The later arrivals are met once each by the claims that set them waiting...
    let mut others = Vec::new();
    for _ in 0..40 {
        let claimed = store.claim(&parts, 100, MAX, i64::MAX).await.unwrap();
        assert!(claimed.rows.iter().all(|r| r.aggregate_id != "hot"));
        others.extend(claimed.rows.iter().map(|r| r.id));
        if !claimed.cut && claimed.rows.is_empty() {
            break;
        }
    }
    others.sort_unstable();
    others.dedup();
    assert_eq!(others.len(), 10, "the other aggregates are claimed");
    // ... and from then on a claim reads about what it returns: without the waiting rows out
    // of its index it read every one of the 22,000 parked events, on every claim.
    let visited = rows_visited_by_a_claim(&db, &store, &[0]).await;
    assert!(visited < 200.0, "a claim visited {visited} rows");

    // An operator skips the dead head: the aggregate comes back, in order.
    let admin = Admin::new(db.pool.clone(), &db.tables);
    assert_eq!(
        admin
            .skip(&[head], "test", "cannot be fixed")
            .await
            .unwrap(),
        1
    );
    let rows = store.claim(&parts, 100, MAX, i64::MAX).await.unwrap().rows;
    let versions: Vec<i64> = rows
        .iter()
        .filter(|r| r.aggregate_id == "hot")
        .filter_map(|r| r.aggregate_version)
        .collect();
    assert_eq!(
        versions,
        (2..102).collect::<Vec<_>>(),
        "from the head's successor on"
    );
}

/// Shared buffers (hit or read) that one execution of `statement` touched, from
/// `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` of it prepared with `types` and run with `args`,
/// in the plan PostgreSQL caches for a prepared statement after a few runs (its generic plan).
async fn buffers_of(db: &TestDb, statement: &str, types: &str, args: &str) -> f64 {
    let mut conn = db.pool.acquire().await.unwrap();
    let name = outbox_testkit::unique("s");
    conn.execute(sqlx::raw_sql(&format!(
        "SET plan_cache_mode = force_generic_plan; PREPARE {name}({types}) AS {statement}"
    )))
    .await
    .unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}({args})"
    ))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    conn.execute(sqlx::raw_sql(&format!(
        "DEALLOCATE {name}; RESET plan_cache_mode"
    )))
    .await
    .unwrap();
    let top = &plan[0]["Plan"];
    top["Shared Hit Blocks"].as_f64().unwrap() + top["Shared Read Blocks"].as_f64().unwrap()
}

/// A queue table's statistics lag behind it: analysed while small, it then holds thousands of
/// published rows whose entries stay in its pending indexes until vacuum. The mark of a few
/// events over many partitions must still touch about what it marks: the statement it
/// replaced joined every id with every lease (32 probes per id here), and scanned a pending
/// index it took for small (2,600 index entries per event at 2,000 events/s in the bench).
#[tokio::test]
async fn a_mark_touches_what_it_marks_whatever_the_statistics_say() {
    let db = TestDb::new(32).await;
    for i in 0..40 {
        write(&db, &format!("early{i}"), 1..2).await;
    }
    db.exec("ANALYZE {schema}.{events}").await;
    let store = PgStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let fences = store.acquire("r1", 32, TTL).await.unwrap();
    assert_eq!(fences.len(), 32);
    let all: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    // 20,000 events published since the statistics were taken.
    for i in 0..200 {
        write(&db, &format!("busy{i}"), 1..101).await;
    }
    loop {
        let rows = store.claim(&all, 1000, MAX, i64::MAX).await.unwrap().rows;
        if rows.len() < 1000 {
            break;
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        store
            .mark_published("r1", &fences, &ids, Marking::Claimed)
            .await
            .unwrap();
    }
    // One event in each of 32 aggregates, over many partitions.
    let pending: Vec<(i64, i32)> = sqlx::query_as(&db.tables.render(
        "SELECT id, partition FROM {schema}.{events} WHERE status = 'pending' ORDER BY id \
         LIMIT 32",
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let ids: Vec<String> = pending.iter().map(|p| p.0.to_string()).collect();
    let parts: Vec<String> = fences.iter().map(|f| f.0.to_string()).collect();
    let epochs: Vec<String> = fences.iter().map(|f| f.1.to_string()).collect();
    let buffers = buffers_of(
        &db,
        store.mark_published_statement(),
        "bigint[], integer[], bigint[], text, boolean",
        &format!(
            "'{{{}}}', '{{{}}}', '{{{}}}', 'r1', true",
            ids.join(","),
            parts.join(","),
            epochs.join(",")
        ),
    )
    .await;
    let marked: i64 = sqlx::query_scalar(&db.tables.render(
        "SELECT count(*) FROM {schema}.{events} WHERE status = 'published' AND id = ANY($1)",
    ))
    .bind(pending.iter().map(|p| p.0).collect::<Vec<_>>())
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(marked, 32);
    let per_event = buffers / 32.0;
    assert!(
        per_event < 25.0,
        "the mark touched {per_event:.1} buffers per event"
    );
}

#[tokio::test]
async fn rows_left_waiting_by_a_hold_deleted_by_hand_are_set_free_by_the_safety_net() {
    let db = TestDb::new(1).await;
    write(&db, "a", 1..6).await;
    let store = PgStore::open(db.pool.clone(), &db.tables).await.unwrap();
    let fences = store.acquire("r1", 1, TTL).await.unwrap();
    let parts = [(0, 0)];
    let head = store.claim(&parts, 1, MAX, i64::MAX).await.unwrap().rows[0].id;
    assert_eq!(
        store
            .mark_failed("r1", &fences, &[dead(head)], true)
            .await
            .unwrap(),
        1
    );
    let waiting = "SELECT count(*) FROM {schema}.{events} \
                   WHERE status = 'pending' AND next_attempt_at IS NOT NULL";
    let count = || async {
        sqlx::query_scalar::<_, i64>(&db.tables.render(waiting))
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    assert_eq!(count().await, 4, "the rest waits behind the dead head");
    // Not how a hold should go (`outbox dead-letters skip` frees the rows too), but possible.
    db.exec("DELETE FROM {schema}.holds").await;
    assert!(store
        .claim(&parts, 100, MAX, i64::MAX)
        .await
        .unwrap()
        .rows
        .is_empty());
    assert_eq!(store.release_stale().await.unwrap(), 4);
    assert_eq!(count().await, 0);
    let versions: Vec<Option<i64>> = store
        .claim(&parts, 100, MAX, i64::MAX)
        .await
        .unwrap()
        .rows
        .iter()
        .map(|r| r.aggregate_version)
        .collect();
    assert_eq!(versions, vec![Some(2), Some(3), Some(4), Some(5)]);
    assert_eq!(
        store.release_stale().await.unwrap(),
        0,
        "nothing left to repair"
    );
}

/// SQLite: with planner statistics (after `ANALYZE` or `PRAGMA optimize`) on a backlog of
/// 20,000 events, SQLite's planner started the claim's due path from the events table and
/// scanned all of it on every claim (2.8 s instead of 11 ms at 200,000 rows), or built an
/// automatic index over it. The claim now drives that path from the holds through the pending
/// rows' index, and no part of it reads the events table whole.
#[tokio::test]
async fn the_sqlite_claim_never_scans_the_events_table_whole() {
    let db = outbox_testkit::SqliteFile::new().await;
    db.exec(
        "WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < 19999)
         INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload)
         SELECT printf('0192f0c4-7d1e-7b3a-9c55-%012d', n), 'order', 'agg-' || (n % 1000),
                'Happened', x'7b7d'
         FROM g;
         ANALYZE;",
    )
    .await;
    let store = outbox_relayer::sqlite::SqliteStore::open(db.pool.clone(), &db.tables)
        .await
        .unwrap();
    let plan = explain(&db, store.claim_statement()).await;
    assert!(!plan.is_empty());
    // The events table's aliases in the claim: e, hd, b, w. A full scan reads "SCAN e"; an
    // index SQLite builds for the statement ("AUTOMATIC … INDEX") reads the table whole too.
    let full_scans: Vec<&String> = plan
        .iter()
        .filter(|line| {
            ["SCAN e", "SCAN hd", "SCAN b", "SCAN w"].contains(&line.trim())
                || line.contains("AUTOMATIC")
        })
        .collect();
    assert!(
        full_scans.is_empty(),
        "{full_scans:?} in\n{}",
        plan.join("\n")
    );
}

/// The `detail` column of `EXPLAIN QUERY PLAN` for the claim, with its parameters bound.
async fn explain(db: &outbox_testkit::SqliteFile, claim: &str) -> Vec<String> {
    use sqlx::Row;
    sqlx::query(&format!("EXPLAIN QUERY PLAN {claim}"))
        .bind("[0]")
        .bind(1000_i64)
        .bind(MAX as i64)
        .bind(0_i64)
        .bind(0_i64)
        .bind(i64::MAX)
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|row| {
            format!(
                "{} {} {}",
                row.get::<i64, _>("id"),
                row.get::<i64, _>("parent"),
                row.get::<String, _>("detail")
            )
        })
        .collect()
}

/// On MariaDB, a claim with a floor (what every full claim of a backlog is followed by) must
/// probe the aggregate index per row it meets. With the floor check in the WHERE clause,
/// MariaDB turned the NOT EXISTS into a materialised anti-join over every pending row below the
/// floor: 2.3 s per claim at 700,000 pending rows, 1,400 events/s for the relay.
#[tokio::test]
async fn the_mysql_claim_never_materialises_the_events_below_the_floor() {
    use sqlx::Row;
    let db = outbox_testkit::MySqlDb::new(4).await;
    db.exec(
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, payload)
         WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < 199)
         SELECT UUID(), 'order', CONCAT('agg-', (a.n * 100 + b.n) % 1000), 'Happened', '{}'
         FROM g a CROSS JOIN g b WHERE b.n < 100;
         ANALYZE TABLE {events};",
    )
    .await;
    let store = outbox_relayer::mysql::MySqlStore::open(db.pool.clone(), &db.tables)
        .await
        .unwrap();
    let parts = 4;
    let floor = 10_000_i64;
    let sql = format!("EXPLAIN {}", store.claim_statement(parts));
    let mut explain = sqlx::query(&sql);
    for p in 0..parts as i32 {
        explain = explain
            .bind(floor)
            .bind(floor)
            .bind(MAX as i64)
            .bind(p)
            .bind(floor)
            .bind(1000_i64);
    }
    explain = explain.bind(1000_i64).bind(MAX as i64);
    for p in 0..parts as i32 {
        explain = explain.bind(p);
    }
    let plan: Vec<String> = explain
        .bind(i64::MAX)
        .bind(1000_i64)
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|row| {
            format!(
                "{} {} {} {}",
                row.get::<String, _>("select_type"),
                row.get::<Option<String>, _>("table").unwrap_or_default(),
                row.get::<Option<String>, _>("type").unwrap_or_default(),
                row.get::<Option<String>, _>("key").unwrap_or_default(),
            )
        })
        .collect();
    assert!(!plan.is_empty());
    // The events table's aliases in the claim: e, hd, b, w.
    let whole: Vec<&String> = plan
        .iter()
        .filter(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            fields[0] == "MATERIALIZED"
                || (["e", "hd", "b", "w"].contains(&fields[1]) && fields[2] == "ALL")
        })
        .collect();
    assert!(whole.is_empty(), "{whole:?} in\n{}", plan.join("\n"));
}
