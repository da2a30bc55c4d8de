-- The reads of `outbox doctor` (doctor/database.rs asks, sqlite/doctor.rs answers).
-- name: version
SELECT sqlite_version();
-- name: applied
SELECT version FROM {migrations};
-- name: recent
-- Up to 50 distinct kinds of event among the last 1,000 written.
SELECT DISTINCT aggregate_type, event_type, schema_version, destination
FROM (SELECT aggregate_type, event_type, schema_version, destination
      FROM {events} ORDER BY id DESC LIMIT 1000) recent
LIMIT 50;
