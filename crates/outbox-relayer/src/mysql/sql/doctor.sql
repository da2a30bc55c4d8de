-- The reads of `outbox doctor` (doctor/database.rs asks, mysql/doctor.rs answers).
-- name: version
SELECT VERSION();
-- name: applied
SELECT version FROM {migrations};
-- name: recent
-- Up to 50 distinct kinds of event among the last 1,000 written. Told apart byte for byte
-- (`Placed` and `placed` are two subjects on a broker, whatever the server's collation), and
-- read as bytes: the keys' binary collation makes them binary columns to the driver.
SELECT DISTINCT CAST(aggregate_type AS BINARY) AS aggregate_type,
       CAST(event_type AS BINARY) AS event_type, schema_version,
       CAST(destination AS BINARY) AS destination
FROM (SELECT aggregate_type, event_type, schema_version, destination
      FROM {events} ORDER BY id DESC LIMIT 1000) recent
LIMIT 50;
