-- Records whether the events table is range-partitioned by `occurred_at`, and the width of each
-- partition in days (NULL: a plain table). Chosen once, when the outbox is created.
ALTER TABLE {schema}.meta ADD COLUMN time_partition_days integer
    CHECK (time_partition_days BETWEEN 1 AND 366);
