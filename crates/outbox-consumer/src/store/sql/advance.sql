-- Records version $4 as the aggregate's last applied (its state row is locked), and as its
-- first when it had none; only in transaction $5 (`same` false: a handler ended it, and this
-- runs in one of its own: nothing is written, and `status` says how it ended). `done` false:
-- no state row.
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version, $5 the transaction (NULL: any)
WITH same AS (
    SELECT $5::text IS NULL OR pg_current_xact_id()::text = $5 AS same
), done AS (
    UPDATE {schema}.consumer_versions
    SET version = $4, first_version = coalesce(first_version, $4), updated_at = now()
    WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
      AND (SELECT same FROM same)
    RETURNING 1
)
SELECT (SELECT same FROM same) AS same, EXISTS (SELECT 1 FROM done) AS done,
       CASE WHEN NOT (SELECT same FROM same) THEN pg_xact_status($5::xid8) END AS status
