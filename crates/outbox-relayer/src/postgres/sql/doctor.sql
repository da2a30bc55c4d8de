-- The reads of `outbox doctor` (doctor/database.rs asks, postgres/doctor.rs answers).
-- name: version
SHOW server_version;
-- name: applied
SELECT version FROM {schema}.migrations;
-- name: lacking
-- Every table of the outbox's schema the relay needs to read and change that this user cannot.
-- $1 schema
SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
  AND NOT (has_schema_privilege(n.oid, 'USAGE')
           AND has_table_privilege(c.oid, 'SELECT, INSERT, UPDATE, DELETE'))
ORDER BY 1;
-- name: vacuum
-- The server's `autovacuum`, the table's own switch, live and dead tuples, and whether it was
-- ever analyzed. $1 the events table, qualified and quoted
SELECT current_setting('autovacuum'),
       coalesce(NOT ('autovacuum_enabled=false' = ANY (c.reloptions)), true),
       s.n_live_tup, s.n_dead_tup,
       (s.last_analyze IS NOT NULL OR s.last_autoanalyze IS NOT NULL)
FROM pg_class c LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid
WHERE c.oid = $1::regclass;
-- name: recent
-- Up to 50 distinct kinds of event among the last 1,000 written.
SELECT DISTINCT aggregate_type, event_type, schema_version, destination
FROM (SELECT aggregate_type, event_type, schema_version, destination
      FROM {schema}.{events} ORDER BY id DESC LIMIT 1000) recent
LIMIT 50;
-- name: cdc_settings
-- `wal_level`, `max_slot_wal_keep_size`, and whether this user may stream changes.
SELECT current_setting('wal_level'), current_setting('max_slot_wal_keep_size'),
       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user);
-- name: current_user
SELECT current_user::text;
-- name: publication_exists
-- $1 publication
SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1);
