-- The inbox: one row per (consumer, event) applied. Inserted in the consumer's own transaction,
-- with the business change, so the effect of an event is applied once (G5).
CREATE TABLE {schema}.inbox (
    consumer     text        NOT NULL CHECK (consumer <> ''),
    event_id     uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Retention: purge deletes by age.
CREATE INDEX inbox_processed_at ON {schema}.inbox (processed_at);
