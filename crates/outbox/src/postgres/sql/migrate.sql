-- The bookkeeping of the migrations (migrate.rs runs them), rendered with the outbox's schema
-- name. `lock`, `bootstrap` and `record` are also printed into `migrate --print` scripts, so
-- they carry no comments of their own: `lock` is the schema's migration lock until the end of
-- the transaction (one per schema name, $1, so that concurrent migrators and CDC set-ups
-- queue, then find the work done); `bootstrap` makes the schema and the bookkeeping table
-- every run starts with; `record` is the bookkeeping row of an applied migration, up to its
-- values.
-- name: lock
SELECT pg_advisory_xact_lock(hashtextextended('outbox.migrate.' || $1, 0));
-- name: bootstrap
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version     integer     PRIMARY KEY,
    description text        NOT NULL,
    checksum    text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
-- name: record
INSERT INTO {schema}.migrations (version, description, checksum) VALUES;
-- name: has_bookkeeping
-- $1: the bookkeeping table's qualified name.
SELECT to_regclass($1) IS NOT NULL;
-- name: applied
SELECT version, checksum FROM {schema}.migrations ORDER BY version;
-- name: settings
-- The settings an outbox was created with.
SELECT partitions, time_partition_days FROM {schema}.meta;
