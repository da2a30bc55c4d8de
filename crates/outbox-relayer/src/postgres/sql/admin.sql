-- name: purge
-- One batch of published rows older than the retention; never pending or dead rows.
-- $1 retention seconds, $2 batch size
WITH doomed AS (
    SELECT id FROM {schema}.{events}
    WHERE status = 'published' AND published_at < now() - make_interval(secs => $1)
    ORDER BY published_at
    LIMIT $2
)
DELETE FROM {schema}.{events} e USING doomed WHERE e.id = doomed.id;
-- name: archive
-- The same batch, moved into the archive table in the same statement.
WITH doomed AS (
    SELECT id FROM {schema}.{events}
    WHERE status = 'published' AND published_at < now() - make_interval(secs => $1)
    ORDER BY published_at
    LIMIT $2
), moved AS (
    DELETE FROM {schema}.{events} e USING doomed WHERE e.id = doomed.id RETURNING e.*
)
INSERT INTO {schema}.{events_name}_archive SELECT * FROM moved;
-- name: purgeable
SELECT count(*)::bigint FROM {schema}.{events}
WHERE status = 'published' AND published_at < now() - make_interval(secs => $1);
-- name: list_dead
-- Every column bounded (the limits are admin/listing.rs's, one character more than it shows
-- so that it can tell a cut): text and the error cut, headers read only when their JSON text
-- is small enough (`headers_size` says how large they are), the payload not read (its size
-- only). So a row with a 50 MB destination costs the listing a few KiB.
-- $1 event type, $2 aggregate type, $3 aggregate id, $4 since, $5 until, $6 error text,
-- $7 limit, $8 ids
SELECT e.id, e.event_id, left(e.aggregate_type, {text_read}) AS aggregate_type,
       left(e.aggregate_id, {text_read}) AS aggregate_id, e.aggregate_version,
       left(e.event_type, {text_read}) AS event_type, e.schema_version,
       left(e.destination, {text_read}) AS destination,
       left(e.content_type, {text_read}) AS content_type,
       CASE WHEN octet_length(hd.text) <= {headers_read} THEN hd.text END AS headers,
       octet_length(hd.text)::bigint AS headers_size,
       -- Clamped to what the relay can represent (a row may say ±infinity).
       LEAST(GREATEST(e.occurred_at, '4714-11-24 00:00:00+00 BC'),
             '262142-12-31 23:59:59+00') AS occurred_at, e.attempts,
       left(coalesce(e.last_error, ''), {error_read}) AS last_error,
       octet_length(e.payload)::bigint AS payload_size,
       EXISTS (SELECT 1 FROM {schema}.holds h
               WHERE h.event_id = e.id AND h.held_until IS NULL) AS parked
FROM {schema}.{events} e
CROSS JOIN LATERAL (SELECT e.headers::text AS text) hd
WHERE e.status = 'dead'
  AND ($1::text IS NULL OR e.event_type = $1)
  AND ($2::text IS NULL OR e.aggregate_type = $2)
  AND ($3::text IS NULL OR e.aggregate_id = $3)
  AND ($4::timestamptz IS NULL OR e.occurred_at >= $4)
  AND ($5::timestamptz IS NULL OR e.occurred_at < $5)
  AND ($6::text IS NULL OR strpos(lower(e.last_error), lower($6)) > 0)
  AND ($8::bigint[] IS NULL OR e.id = ANY($8))
ORDER BY e.id
LIMIT $7;
-- name: payload
SELECT payload FROM {schema}.{events} WHERE id = $1;
-- name: replay
-- Dead events become pending again, attempts and permanent failures reset, their wait
-- (the lag gauge's) counted from now. Each aggregate
-- concerned gets its hold on its first pending row, due at once: it resumes with that row,
-- in id order (the polling claim's due path, the CDC source's table path). A hold is the
-- record that an aggregate has events waiting in the table, so it moves rather than goes: a
-- CDC relay that was stopped meanwhile finds it when it starts.
-- An aggregate parked on a dead event this replay leaves dead stays parked on it: its
-- replayed events after that one wait behind it, and one before it is not replayed (`kept`:
-- the park records one dead event per aggregate, so a replayed event that failed again there
-- would take the park over and a later skip would let the aggregate pass the other one).
-- Replaying both together resumes the aggregate in id order.
-- Audited in the same statement. $1 ids, $2 actor, $3 reason
WITH asked AS (
    SELECT e.id, e.aggregate_type, e.aggregate_id
    FROM {schema}.{events} e
    WHERE e.id = ANY($1) AND e.status = 'dead'
), kept AS (
    -- The parks this replay leaves in place: on a dead event it does not replay.
    SELECT h.aggregate_type, h.aggregate_id, h.event_id
    FROM (SELECT DISTINCT aggregate_type, aggregate_id FROM asked) a
    JOIN {schema}.holds h
      ON h.aggregate_type = a.aggregate_type AND h.aggregate_id = a.aggregate_id
    JOIN {schema}.{events} d
      ON d.id = h.event_id AND d.aggregate_type = h.aggregate_type
     AND d.aggregate_id = h.aggregate_id
    WHERE h.held_until IS NULL AND d.status = 'dead' AND NOT h.event_id = ANY($1)
), replayed AS (
    UPDATE {schema}.{events} e
    SET status = 'pending', attempts = 0, permanent_failures = 0, next_attempt_at = NULL,
        enqueued_at = now()
    FROM asked a
    WHERE e.id = a.id AND e.status = 'dead'
      AND NOT EXISTS (
          SELECT 1 FROM kept k
          WHERE k.aggregate_type = a.aggregate_type AND k.aggregate_id = a.aggregate_id
            AND k.event_id > a.id
      )
    RETURNING e.id, e.partition, e.aggregate_type, e.aggregate_id
), resumed AS (
    -- The aggregates that resume: every one replayed into, unless it stays parked.
    SELECT DISTINCT r.aggregate_type, r.aggregate_id
    FROM replayed r
    WHERE NOT EXISTS (
        SELECT 1 FROM kept k
        WHERE k.aggregate_type = r.aggregate_type AND k.aggregate_id = r.aggregate_id
    )
), heads AS (
    -- The first pending row of each aggregate: a replayed one, or one pending before (this
    -- statement's snapshot still reads the replayed rows as dead).
    SELECT DISTINCT ON (c.aggregate_type, c.aggregate_id)
           c.aggregate_type, c.aggregate_id, c.id, c.partition
    FROM (
        SELECT r.id, r.partition, r.aggregate_type, r.aggregate_id
        FROM replayed r JOIN resumed USING (aggregate_type, aggregate_id)
        UNION ALL
        SELECT p.id, p.partition, p.aggregate_type, p.aggregate_id
        FROM resumed r
        CROSS JOIN LATERAL (
            SELECT e.id, e.partition, e.aggregate_type, e.aggregate_id
            FROM {schema}.{events} e
            WHERE e.aggregate_type = r.aggregate_type AND e.aggregate_id = r.aggregate_id
              AND e.status = 'pending'
            ORDER BY e.id
            LIMIT 1
        ) p
    ) c
    ORDER BY c.aggregate_type, c.aggregate_id, c.id
), held AS (
    INSERT INTO {schema}.holds (aggregate_type, aggregate_id, partition, event_id, held_until)
    SELECT aggregate_type, aggregate_id, partition, id, now() FROM heads
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE
        SET event_id = EXCLUDED.event_id, partition = EXCLUDED.partition,
            held_until = EXCLUDED.held_until, created_at = now()
        -- Checked on the hold as committed when the insert met it: a park a relay wrote
        -- after this statement's snapshot (a dead letter of the aggregate at this moment)
        -- stays.
        WHERE holds.held_until IS NOT NULL OR holds.event_id = ANY($1)
), audited AS (
    INSERT INTO {schema}.audit (actor, action, event_ids, reason)
    SELECT $2, 'replay', array_agg(id ORDER BY id), $3 FROM replayed HAVING count(*) > 0
)
-- How many were replayed, and the dead ones asked for that the park rule left dead.
SELECT (SELECT count(*) FROM replayed)::bigint,
       ARRAY(SELECT a.id FROM asked a
             WHERE EXISTS (SELECT 1 FROM kept k
                           WHERE k.aggregate_type = a.aggregate_type
                             AND k.aggregate_id = a.aggregate_id AND k.event_id > a.id)
             ORDER BY a.id);
-- name: skip
-- The dead events stay dead (for the record) but stop parking their aggregates: a hold on one
-- of them moves to its aggregate's first pending row, due at once (the rows waiting behind
-- it go on from there, in id order), or goes when nothing of the aggregate is pending. See
-- `replay` for why a hold moves. Audited. $1 ids, $2 actor, $3 reason
WITH target AS (
    SELECT h.aggregate_type, h.aggregate_id, h.event_id
    FROM {schema}.holds h
    JOIN {schema}.{events} e ON e.id = h.event_id
    WHERE h.event_id = ANY($1) AND e.status = 'dead'
      AND e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
), heads AS (
    SELECT t.aggregate_type, t.aggregate_id, t.event_id, p.id, p.partition
    FROM target t
    LEFT JOIN LATERAL (
        SELECT e.id, e.partition FROM {schema}.{events} e
        WHERE e.aggregate_type = t.aggregate_type AND e.aggregate_id = t.aggregate_id
          AND e.status = 'pending'
        ORDER BY e.id
        LIMIT 1
    ) p ON true
), moved AS (
    UPDATE {schema}.holds h
    SET event_id = n.id, partition = n.partition, held_until = now(), created_at = now()
    FROM heads n
    WHERE n.id IS NOT NULL
      AND h.aggregate_type = n.aggregate_type AND h.aggregate_id = n.aggregate_id
    RETURNING n.event_id
), unheld AS (
    DELETE FROM {schema}.holds h USING heads n
    WHERE n.id IS NULL
      AND h.aggregate_type = n.aggregate_type AND h.aggregate_id = n.aggregate_id
    RETURNING n.event_id, h.aggregate_type, h.aggregate_id
), resumed AS (
    UPDATE {schema}.{events} e SET next_attempt_at = NULL
    FROM unheld u
    WHERE e.aggregate_type = u.aggregate_type AND e.aggregate_id = u.aggregate_id
      AND e.status = 'pending' AND e.next_attempt_at IS NOT NULL
), released AS (
    SELECT event_id FROM moved UNION ALL SELECT event_id FROM unheld
), audited AS (
    INSERT INTO {schema}.audit (actor, action, event_ids, reason)
    SELECT $2, 'skip', array_agg(event_id ORDER BY event_id), $3 FROM released
    HAVING count(*) > 0
)
SELECT count(*)::bigint FROM released;
-- name: audit
SELECT id, at, actor, action, event_ids, reason FROM {schema}.audit ORDER BY id DESC LIMIT $1;
