-- The bookkeeping of the migrations (migrate.rs runs them), rendered with the outbox's table
-- names. `lock` names the lock migrators take (? the schema); `bootstrap`, `record` (the
-- bookkeeping row of an applied migration, up to its values) and `lease` (lease rows, up to
-- their values; those already there are kept) are also printed into `migrate --print`
-- scripts, so they carry no comments of their own.
-- name: lock
CONCAT('outbox.migrate.', LEFT(DATABASE(), 16), '.', LEFT(?, 32));
-- name: bootstrap
CREATE TABLE IF NOT EXISTS {migrations} (
    version     INT          NOT NULL PRIMARY KEY,
    description VARCHAR(255) NOT NULL,
    checksum    VARCHAR(64)  NOT NULL,
    applied_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
-- name: record
INSERT INTO {migrations} (version, description, checksum) VALUES;
-- name: lease
INSERT IGNORE INTO {leases} (`partition`) VALUES;
-- name: has_bookkeeping
-- ? the bookkeeping table's name.
SELECT count(*) FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = ?;
-- name: applied
SELECT version, checksum FROM {migrations} ORDER BY version;
-- name: leases
SELECT count(*) FROM {leases};
-- name: partitions
-- The partition count the outbox was created with.
SELECT partitions FROM {meta} WHERE singleton = 1;
