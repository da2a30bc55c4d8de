//! (f) `parked`: what one claim costs while an aggregate waits behind a dead head with a long
//! backlog. The relay's own claim (`outbox_relayer::postgres::PgStore`) over 1,000 claimable events
//! of other aggregates, first with nothing parked (the baseline, in the same run), then with
//! `--parked` events behind a dead head: the claim's time (median and p99 of `--claims`
//! claims, nothing marked, so each claim reads the same rows, starting with the parked
//! aggregate's partition) and the rows of the events table one claim visits
//! (`EXPLAIN ANALYZE`). A claim that costs O(batch) reads the same in both.

use std::time::{Duration, Instant};

use outbox_relayer::{postgres::PgStore, store::Failure};
use sqlx::Executor;

use crate::{
    common::{interruptible, Result, Scope},
    context::Bench,
};

/// Events of other aggregates, claimable.
const CLAIMABLE: u64 = 1_000;
/// Rows per claim.
const BATCH: i64 = 100;
const MAX_PAYLOAD: usize = 1 << 20;

/// One measurement.
#[derive(Clone, Debug)]
pub struct ParkedRow {
    /// Events waiting behind the dead head.
    pub parked: u64,
    /// Median claim time.
    pub p50: Duration,
    /// 99th percentile claim time.
    pub p99: Duration,
    /// Rows of the events table one claim visits.
    pub visited: f64,
    /// Rows one claim returns.
    pub claimed: usize,
}

/// Runs the baseline and the parked measurement, each in its own schema.
pub async fn run(bench: &Bench, parked: u64, claims: usize) -> Result<Vec<ParkedRow>> {
    let mut rows = Vec::new();
    for n in [0, parked] {
        let scope = bench.scope("parked")?;
        bench.create_outbox(&scope).await?;
        let result = interruptible(measure(bench, &scope, n, claims)).await;
        bench.cleanup_schema(&scope).await;
        rows.push(result?);
    }
    Ok(rows)
}

async fn measure(bench: &Bench, scope: &Scope, parked: u64, claims: usize) -> Result<ParkedRow> {
    let table = scope.events_table();
    if parked > 0 {
        bench.log(
            scope.scenario,
            format!("writing {parked} events of one aggregate"),
        );
        sqlx::query(&format!(
            "INSERT INTO {table} (event_id, aggregate_type, aggregate_id, event_type, payload)
             SELECT gen_random_uuid(), 'order', 'hot', 'OrderPlaced', '\\x7b7d'
             FROM generate_series(1, $1)"
        ))
        .bind(parked as i64)
        .execute(&bench.pool)
        .await?;
    }
    bench.insert_backlog(scope, CLAIMABLE).await?;
    let store = PgStore::open(bench.pool.clone(), &scope.tables).await?;
    let fences = store
        .acquire("bench", i64::MAX, Duration::from_secs(3600))
        .await?;
    // The parked aggregate's partition first, as the relay's rotation puts it in turn: a claim
    // that reached it before filling its batch used to read the whole parked backlog.
    let hot: Option<i32> = sqlx::query_scalar(&format!(
        "SELECT partition FROM {table} WHERE aggregate_id = 'hot' LIMIT 1"
    ))
    .fetch_optional(&bench.pool)
    .await?;
    let mut partitions: Vec<(i32, i64)> = fences.iter().map(|f| (f.0, 0)).collect();
    partitions.sort_by_key(|(p, _)| Some(*p) != hot);
    if parked > 0 {
        // The hot aggregate's head fails for good: parked, the rest waits.
        let head: i64 = sqlx::query_scalar(&format!(
            "SELECT min(id) FROM {table} WHERE aggregate_id = 'hot'"
        ))
        .fetch_one(&bench.pool)
        .await?;
        let failure = Failure {
            id: head,
            error: "permanent: rejected".into(),
            backoff: Duration::ZERO,
            dead: true,
            permanent: true,
        };
        store
            .mark_failed("bench", &fences, &[failure], true)
            .await?;
    }
    let mut times = Vec::with_capacity(claims);
    let mut claimed = 0;
    for _ in 0..claims {
        let started = Instant::now();
        let batch = store
            .claim(&partitions, BATCH, MAX_PAYLOAD, i64::MAX)
            .await?;
        times.push(started.elapsed());
        claimed = batch.rows.len();
    }
    times.sort_unstable();
    let visited = rows_visited(bench, &store, &partitions, &scope.tables).await?;
    let row = ParkedRow {
        parked,
        p50: times[times.len() / 2],
        p99: times[(times.len() * 99 / 100).min(times.len() - 1)],
        visited,
        claimed,
    };
    bench.log(scope.scenario, format!("{row:?}"));
    Ok(row)
}

/// Rows of the events table one claim visits, from `EXPLAIN (ANALYZE, FORMAT JSON)`.
async fn rows_visited(
    bench: &Bench,
    store: &PgStore,
    partitions: &[(i32, i64)],
    tables: &outbox::Tables,
) -> Result<f64> {
    let mut conn = bench.pool.acquire().await?;
    conn.execute(sqlx::raw_sql(&format!(
        "PREPARE bench_claim(integer[], bigint, integer, bigint[], bigint) AS {}",
        store.claim_statement()
    )))
    .await?;
    let parts: Vec<String> = partitions.iter().map(|p| p.0.to_string()).collect();
    let floors: Vec<&str> = partitions.iter().map(|_| "0").collect();
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE bench_claim('{{{}}}', {BATCH}, {MAX_PAYLOAD}, \
         '{{{}}}', {})",
        parts.join(","),
        floors.join(","),
        i64::MAX
    ))
    .fetch_one(&mut *conn)
    .await?;
    conn.execute("DEALLOCATE bench_claim").await?;
    fn visit(node: &serde_json::Value, table: &str) -> f64 {
        let here = if node["Relation Name"] == table {
            let loops = node["Actual Loops"].as_f64().unwrap_or(1.0);
            let rows = node["Actual Rows"].as_f64().unwrap_or(0.0)
                + node["Rows Removed by Filter"].as_f64().unwrap_or(0.0);
            rows * loops
        } else {
            0.0
        };
        here + node["Plans"]
            .as_array()
            .map_or(0.0, |plans| plans.iter().map(|p| visit(p, table)).sum())
    }
    Ok(visit(&plan[0]["Plan"], tables.events().as_str()))
}

/// The results as a markdown table.
pub fn render(rows: &[ParkedRow]) -> String {
    let mut out = String::from(
        "| events parked behind a dead head | claim p50 | claim p99 | rows visited per claim | rows claimed |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.2} ms | {:.2} ms | {:.0} | {} |\n",
            r.parked,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.visited,
            r.claimed
        ));
    }
    out
}
