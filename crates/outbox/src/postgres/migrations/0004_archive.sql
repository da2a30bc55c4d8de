-- Where `outbox purge --archive` moves published events instead of deleting them: the same
-- columns as the events table, as plain columns (no identity, no generated partition).
CREATE TABLE {schema}.{events_name}_archive (LIKE {schema}.{events} INCLUDING DEFAULTS);
CREATE INDEX {events_name}_archive_published_at ON {schema}.{events_name}_archive (published_at);
