-- How long an event has waited in the outbox, by the database's clock: `enqueued_at` is set by
-- the database when the row is written. It is relay state (writers leave it out): the lag
-- gauge reads it, never the writer's `occurred_at`, which may lie far in the past (a backfill)
-- or ahead (a writer's skewed clock).
--
-- Without copying the table (a copy would hold the application's inserts for its duration):
-- the column is added empty, its default set after, and only pending rows, those the gauge
-- reads, are given a time, this migration's; published and dead rows keep none. Each step is
-- skipped when done, so that a migration cut short completes on the next run.
SET @outbox_ddl = IF(EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = DATABASE() AND table_name = '{events}'
          AND column_name = 'enqueued_at'),
    'DO 0',
    'ALTER TABLE {events} ADD COLUMN enqueued_at DATETIME(6) NULL');
PREPARE outbox_step FROM @outbox_ddl;
EXECUTE outbox_step;
DEALLOCATE PREPARE outbox_step;
ALTER TABLE {events} ALTER COLUMN enqueued_at SET DEFAULT (UTC_TIMESTAMP(6));
UPDATE {events} SET enqueued_at = UTC_TIMESTAMP(6)
WHERE status = 'pending' AND enqueued_at IS NULL;
-- The lag gauge: the oldest pending row by its arrival (built online: writes go on).
SET @outbox_ddl = IF(EXISTS (
        SELECT 1 FROM information_schema.statistics
        WHERE table_schema = DATABASE() AND table_name = '{events}'
          AND index_name = '{events}_status_enqueued'),
    'DO 0',
    'ALTER TABLE {events} ADD KEY {events}_status_enqueued (status, enqueued_at)');
PREPARE outbox_step FROM @outbox_ddl;
EXECUTE outbox_step;
DEALLOCATE PREPARE outbox_step;
SET @outbox_ddl = IF(EXISTS (
        SELECT 1 FROM information_schema.statistics
        WHERE table_schema = DATABASE() AND table_name = '{events}'
          AND index_name = '{events}_status_age'),
    'ALTER TABLE {events} DROP KEY {events}_status_age',
    'DO 0');
PREPARE outbox_step FROM @outbox_ddl;
EXECUTE outbox_step;
DEALLOCATE PREPARE outbox_step;
