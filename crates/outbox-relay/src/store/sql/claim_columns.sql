-- The columns a claim reads (inlined as `{claim_columns:$N}`, $N the max payload bytes): the
-- payload only when it is at most $N bytes (its size always), and `occurred_at` NULL when the
-- relay cannot represent it (see claim.sql).
e.id, e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version, e.event_type,
       e.schema_version, e.destination,
       CASE WHEN octet_length(e.payload) <= {max_payload} THEN e.payload END AS payload,
       octet_length(e.payload)::bigint AS payload_size,
       e.content_type, e.headers,
       CASE WHEN e.occurred_at > '-infinity' AND e.occurred_at < '262143-01-01 00:00:00+00'
            THEN e.occurred_at END AS occurred_at,
       e.partition, e.attempts
