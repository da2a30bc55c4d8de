-- The zero-growth write's plans: index scans, planned once per session.
-- * Its DELETE must find its rows through the `event_id` index whatever the table's statistics
--   say. The table is empty but for dead tuples, and until ANALYZE has seen it (never, where
--   autovacuum is off) the planner takes it for ten pages and caches a sequential scan: every
--   write then reads every dead tuple of the table (measured: p99 in the hundreds of
--   milliseconds at 2,000 writes/s, growing with the table).
-- * Left to choose, the plan cache re-plans both statements on every call (a custom plan for
--   one id looks cheaper than the generic one), the live-slot check with them (measured with
--   pgbench, 16 clients at 2,000 writes/s on 2 cores: 43-61% of the CPU busy re-planning, 41%
--   with the plans kept, 32% for the same inserts in table mode).
-- With sequential scans off, the generic plans are index scans, and they are kept.
ALTER FUNCTION {schema}.{events_name}_enqueue_zero_growth(
    uuid[], text[], text[], bigint[], text[], integer[], text[], bytea[], text[], jsonb[],
    timestamptz[]
) SET enable_seqscan = off SET plan_cache_mode = force_generic_plan;
