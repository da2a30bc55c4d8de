-- The consumers' version gate: per consumer and aggregate, the last aggregate_version applied.
-- Written in the consumer's transaction with its inbox row and its effect, so the events of an
-- aggregate apply in version order, each once, whatever order the broker delivers them in.
CREATE TABLE {schema}.consumer_versions (
    consumer       text        NOT NULL CHECK (consumer <> ''),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
);
