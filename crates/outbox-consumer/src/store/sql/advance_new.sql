-- The aggregate's first version applied, when it had no state row; only in transaction $5
-- (`same` false: a handler ended it, and this runs in one of its own: nothing is written, and
-- `status` says how it ended). A row inserted meanwhile by a concurrent transaction inserts
-- nothing (`done` false): the caller tries the event again.
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version, $5 the transaction (NULL: any)
WITH same AS (
    SELECT $5::text IS NULL OR pg_current_xact_id()::text = $5 AS same
), done AS (
    INSERT INTO {schema}.consumer_versions
        (consumer, aggregate_type, aggregate_id, version, first_version)
    SELECT $1, $2, $3, $4, $4
    WHERE (SELECT same FROM same)
    ON CONFLICT (consumer, aggregate_type, aggregate_id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT same FROM same) AS same, EXISTS (SELECT 1 FROM done) AS done,
       CASE WHEN NOT (SELECT same FROM same) THEN pg_xact_status($5::xid8) END AS status
