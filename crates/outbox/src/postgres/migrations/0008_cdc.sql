-- Change data capture (relay `mode = "cdc"`): one row per replication slot set up by
-- `outbox migrate --cdc`. `catch_up_max_id` is the highest event id visible when the slot was
-- created: pending rows up to it may predate the slot (the stream will never carry them), so
-- the CDC relay publishes them from the table first, then clears it.
CREATE TABLE {schema}.cdc_slots (
    slot            text        PRIMARY KEY,
    publication     text        NOT NULL,
    catch_up_max_id bigint,
    created_at      timestamptz NOT NULL DEFAULT now()
);
