-- Statements of the CDC source (see cdc/mod.rs). Every write of event state is fenced by the
-- partition leases, which the streaming relay holds all of.
-- name: fence_count
-- How many of the given leases this relay still holds (locked until the transaction ends).
-- $1 true (unused otherwise), $2/$3 (partition, epoch) pairs, $4 relay id
WITH fence AS (
    {fence}
)
SELECT count(*)::bigint FROM fence WHERE $1::boolean;
-- name: spill
-- Writes events that are not rows of the table (zero-growth rows deleted in their
-- transaction, table-less messages) into it, for the table path: pending, or dead with the
-- error. Returns an id for each, in order: the new row's, or that of the row already holding
-- its event id (a transaction streamed again after a restart), and whether it is new.
-- `ON CONFLICT DO NOTHING`
-- without a target: a time-partitioned outbox has no unique index on `event_id` alone. A row
-- the table refuses otherwise (a duplicate aggregate version, a user's constraint) fails the
-- statement; the relay then writes the rows one at a time (see table_path.rs).
-- $1 event ids, $2 aggregate types, $3 aggregate ids, $4 versions, $5 event types,
-- $6 schema versions, $7 destinations, $8 payloads, $9 content types, $10 headers,
-- $11 occurred at, $12 statuses, $13 attempts, $14 errors, $15 backoff seconds,
-- $16 permanent failures (headers as JSON text)
WITH s AS (
    SELECT * FROM unnest(
        $1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::integer[], $7::text[],
        $8::bytea[], $9::text[], $10::text[], $11::timestamptz[], $12::text[], $13::integer[],
        $14::text[], $15::double precision[], $16::integer[]
    ) WITH ORDINALITY AS s(
        event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
        destination, payload, content_type, headers, occurred_at, status, attempts, error,
        backoff, permanent_failures, ord
    )
), written AS (
    INSERT INTO {schema}.{events} (
        event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
        destination, payload, content_type, headers, occurred_at, status, attempts, last_error,
        next_attempt_at, permanent_failures
    )
    SELECT s.event_id, s.aggregate_type, s.aggregate_id, s.aggregate_version, s.event_type,
           s.schema_version, s.destination, s.payload, s.content_type, s.headers::jsonb,
           COALESCE(s.occurred_at, now()), s.status, s.attempts, s.error,
           CASE WHEN s.status = 'pending' AND s.backoff IS NOT NULL
                THEN now() + make_interval(secs => s.backoff) END,
           s.permanent_failures
    FROM s
    ORDER BY s.ord
    ON CONFLICT DO NOTHING
    RETURNING id, event_id
)
SELECT coalesce(
    (SELECT w.id FROM written w WHERE w.event_id = s.event_id),
    (SELECT e.id FROM {schema}.{events} e WHERE e.event_id = s.event_id ORDER BY e.id LIMIT 1)
) AS id,
EXISTS (SELECT 1 FROM written w WHERE w.event_id = s.event_id) AS fresh
FROM s
ORDER BY s.ord;
-- name: hold
-- Holds (or parks, with a NULL $7) an aggregate whose events were spilled into the table,
-- fenced: only while this relay holds every lease it streams under. Says whether it did. The
-- stream position ($8 commit, $9 change) of the first event handed over is kept while the
-- hold lasts (see migration 0013). With $10 false, an existing hold stays as it is.
-- $1 aggregate type, $2/$3 (partition, epoch) pairs, $4 relay id, $5 aggregate id,
-- $6 head event id, $7 held until (seconds from now), $8/$9 stream position, $10 replace
WITH fence AS (
    {fence}
), fenced AS (
    SELECT count(*) = cardinality($2::integer[]) AS held FROM fence
), written AS (
    INSERT INTO {schema}.holds (
        aggregate_type, aggregate_id, partition, event_id, held_until, stream_commit_lsn,
        stream_change_lsn
    )
    SELECT $1, $5, e.partition, e.id,
           CASE WHEN $7::double precision IS NULL THEN NULL
                ELSE now() + make_interval(secs => $7) END,
           $8::bigint, $9::bigint
    FROM {schema}.{events} e, fenced
    WHERE fenced.held AND e.id = $6
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE
        SET event_id = EXCLUDED.event_id, partition = EXCLUDED.partition,
            held_until = EXCLUDED.held_until, created_at = now(),
            stream_commit_lsn = coalesce(holds.stream_commit_lsn, EXCLUDED.stream_commit_lsn),
            stream_change_lsn = CASE WHEN holds.stream_commit_lsn IS NULL
                                     THEN EXCLUDED.stream_change_lsn
                                     ELSE holds.stream_change_lsn END
        WHERE $10::boolean
)
SELECT held FROM fenced;
-- name: pending_of
-- The pending rows of one aggregate, in id order (the table path), but none at or after the
-- head of a hold that is not due (parked, or retrying later): a relay acting on a stale view
-- of the holds (one that lost its leases, or raced another statement) must not publish past
-- a dead event. $1 type, $2 id, $3 limit, $4 max payload bytes
SELECT {claim_columns:$4}
FROM {schema}.{events} e
WHERE e.aggregate_type = $1 AND e.aggregate_id = $2 AND e.status = 'pending'
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.holds h
      WHERE h.aggregate_type = $1 AND h.aggregate_id = $2 AND e.id >= h.event_id
        AND (h.held_until IS NULL OR h.held_until > now())
  )
ORDER BY e.id
LIMIT $3;
-- name: catch_up
-- Pending rows that may predate the slot (id up to $1), not held, in id order.
-- $1 max id, $2 limit, $3 max payload bytes
SELECT {claim_columns:$3}
FROM {schema}.{events} e
WHERE e.status = 'pending' AND e.id <= $1
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.holds h
      WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
  )
ORDER BY e.id
LIMIT $2;
-- name: catch_up_max_id
SELECT catch_up_max_id FROM {schema}.cdc_slots WHERE slot = $1;
-- name: catch_up_done
-- Records that the rows up to $5 are caught up. A record made since (the slot lost and made
-- again meanwhile, with a higher id) stays: those rows are still to catch up. Fenced (see
-- `hold`); says whether this relay still held its leases.
-- $1 slot, $2/$3 (partition, epoch) pairs, $4 relay id, $5 the highest id caught up
WITH fence AS (
    {fence}
), fenced AS (
    SELECT count(*) = cardinality($2::integer[]) AS held FROM fence
), done AS (
    UPDATE {schema}.cdc_slots SET catch_up_max_id = NULL
    FROM fenced WHERE fenced.held AND slot = $1 AND catch_up_max_id = $5
)
SELECT held FROM fenced;
-- name: holds
-- Every held or parked aggregate, with the seconds until its hold lapses (NULL: parked) and
-- the stream position where it was first handed to the table path.
SELECT aggregate_type, aggregate_id,
       EXTRACT(epoch FROM held_until - now())::double precision AS wait_seconds,
       stream_commit_lsn, stream_change_lsn
FROM {schema}.holds;
-- name: unpark
-- Gives an aggregate back to the stream once the table holds nothing pending of it: removes
-- its hold. Fenced (see `hold`): a paused former streamer cannot release its successor's
-- hold. Says whether the leases were held and whether the aggregate is free.
-- $1 type, $2/$3 (partition, epoch) pairs, $4 relay id, $5 aggregate id
WITH fence AS (
    {fence}
), fenced AS (
    SELECT count(*) = cardinality($2::integer[]) AS held FROM fence
), free AS (
    SELECT NOT EXISTS (
        SELECT 1 FROM {schema}.{events} e
        WHERE e.aggregate_type = $1 AND e.aggregate_id = $5 AND e.status = 'pending'
    ) AS ok
), gone AS (
    DELETE FROM {schema}.holds h USING free, fenced
    WHERE fenced.held AND free.ok AND h.aggregate_type = $1 AND h.aggregate_id = $5
)
SELECT fenced.held, free.ok FROM fenced, free;
-- name: slot
-- The slot's state: who streams it, WAL not yet confirmed, WAL retained, and the database it
-- belongs to when that is not this one (a slot is cluster-wide, its changes one database's).
SELECT active_pid,
       (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint AS lag_bytes,
       (pg_current_wal_lsn() - restart_lsn)::bigint AS retained_bytes,
       wal_status,
       CASE WHEN database IS DISTINCT FROM current_database()
            THEN coalesce(database::text, '(none: a physical slot)') END AS elsewhere,
       current_database()::text AS here,
       now() AS now
FROM pg_replication_slots WHERE slot_name = $1;
-- name: terminate
-- Ends a walsender still holding the slot for a relay whose lease this one has taken over;
-- only while this relay holds every lease (fenced, see `hold`). Says whether it did.
-- $1 slot, $2/$3 (partition, epoch) pairs, $4 relay id
WITH fence AS (
    {fence}
), fenced AS (
    SELECT count(*) = cardinality($2::integer[]) AS held FROM fence
), ended AS (
    SELECT pg_terminate_backend(s.active_pid) AS ok
    FROM pg_replication_slots s, fenced
    WHERE fenced.held AND s.slot_name = $1 AND s.active_pid IS NOT NULL
)
SELECT fenced.held FROM fenced WHERE (SELECT count(*) FROM ended) >= 0;
-- name: heartbeat
SELECT pg_logical_emit_message(false, $1, ''::text)::text;
-- name: relay_write
SELECT pg_logical_emit_message(true, $1, ''::text)::text;
-- name: invisible
-- How many of the given transactions (32-bit ids, as the stream gives them) are not yet
-- visible to queries: committed in the WAL (the stream carried them) but still in progress
-- for snapshots, as a commit waiting for a synchronous standby is. Each id is widened to its
-- 64-bit form with the epoch of the next transaction id. $1 transaction ids
WITH f AS (
    SELECT s.snap, pg_snapshot_xmax(s.snap)::text::bigint AS next
    FROM (SELECT pg_current_snapshot() AS snap) s
)
SELECT count(*)::bigint
FROM f, unnest($1::bigint[]) AS x(xid)
WHERE NOT pg_visible_in_snapshot(
    (greatest((f.next >> 32) - CASE WHEN x.xid > (f.next & 4294967295) THEN 1 ELSE 0 END, 0)
        << 32 | x.xid)::text::xid8,
    f.snap
);
