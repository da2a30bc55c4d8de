-- How long an event has waited in the outbox, by the database's clock: `enqueued_at` is set by
-- the database when the row is written. It is relay state (writers leave it out): the lag
-- gauge reads it, never the writer's `occurred_at`, which may lie far in the past (a backfill)
-- or ahead (a writer's skewed clock). Rows already written count from this migration (a
-- stable default is stored once, without rewriting the table); later rows from their insert.
ALTER TABLE {schema}.{events} ADD COLUMN enqueued_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE {schema}.{events} ALTER COLUMN enqueued_at SET DEFAULT clock_timestamp();
ALTER TABLE {schema}.{events_name}_archive ADD COLUMN enqueued_at timestamptz;
-- The lag gauge: the oldest pending row by its arrival, without scanning the backlog.
CREATE INDEX {events_name}_pending_enqueued ON {schema}.{events} (enqueued_at)
    WHERE status = 'pending';
DROP INDEX {schema}.{events_name}_pending_age;
