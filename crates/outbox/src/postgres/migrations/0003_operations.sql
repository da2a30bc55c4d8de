-- Purge finds published rows by age without scanning the table.
CREATE INDEX {events_name}_published_at ON {schema}.{events} (published_at)
    WHERE status = 'published';

-- Every operator action that changes event state (dead-letter replay, skip) is recorded here.
CREATE TABLE {schema}.audit (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL,
    action    text        NOT NULL,
    event_ids bigint[]    NOT NULL,
    reason    text        NOT NULL,
    details   jsonb       NOT NULL DEFAULT '{}'::jsonb
);
