-- Turns the freshly created, empty events table into one range-partitioned by `occurred_at`,
-- keeping every column, default, check and generated column. Unique keys must include the
-- partition key, so the primary key becomes (id, occurred_at) and event ids stay unique per
-- occurred_at; the one-event-per-aggregate-version rule moves to a trigger (below).
CREATE TABLE {schema}.{events_name}_partitioned (
    LIKE {schema}.{events} INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING IDENTITY
        INCLUDING CONSTRAINTS INCLUDING COMMENTS
) PARTITION BY RANGE (occurred_at);
DROP TABLE {schema}.{events};
ALTER TABLE {schema}.{events_name}_partitioned RENAME TO {events_name};
ALTER TABLE {schema}.{events} ADD PRIMARY KEY (id, occurred_at);
ALTER TABLE {schema}.{events} ADD CONSTRAINT {events_name}_event_id_key UNIQUE (event_id, occurred_at);

-- Rows whose occurred_at no partition covers (far past or future) land here; never dropped.
CREATE TABLE {schema}.{events_name}_default PARTITION OF {schema}.{events} DEFAULT;

-- One event per (aggregate, version), across partitions: the check is migration 0018's
-- function, run before each insert.
CREATE TRIGGER {events_name}_unique_version BEFORE INSERT ON {schema}.{events}
    FOR EACH ROW EXECUTE FUNCTION {schema}.{events_name}_unique_version();
