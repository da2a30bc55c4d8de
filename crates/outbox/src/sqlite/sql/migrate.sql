-- The bookkeeping of the migrations (migrate.rs runs them), rendered with the outbox's table
-- names. `bootstrap` and `record` (the bookkeeping row of an applied migration, up to its
-- values) are also printed into `migrate --print` scripts, so they carry no comments of their
-- own.
-- name: bootstrap
CREATE TABLE IF NOT EXISTS {migrations} (
    version     INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    checksum    TEXT NOT NULL,
    applied_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')));
-- name: record
INSERT INTO {migrations} (version, description, checksum) VALUES;
-- name: has_bookkeeping
-- ?1 the bookkeeping table's name.
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1;
-- name: applied
SELECT version, checksum FROM {migrations} ORDER BY version;
-- name: dependents
-- The views and triggers that name the events table (?1), views first: the order that makes
-- them again.
SELECT type, name, sql FROM sqlite_master
WHERE type IN ('view', 'trigger') AND sql IS NOT NULL
  AND (tbl_name = ?1 OR instr(lower(sql), lower(?1)) > 0)
ORDER BY type = 'trigger', rowid;
