-- The columns a claim reads (inlined as `{claim_columns:$N}`, $N the max payload bytes), in a
-- form that cannot fail to decode, whatever a writer stored:
-- * the payload only when it is at most $N bytes (its size always);
-- * `headers` as JSON text (the relay parses it: jsonb holds numbers and nesting depths a JSON
--   parser may refuse, and one such row must not fail the whole claim);
-- * text columns and headers only up to a size limit (4 KiB each, 64 KiB of headers as JSON
--   text: what the CDC stream carries and measures, `ClaimedRow::over_limits`), so a
--   claim never loads megabytes of metadata: over it, the value is replaced (an aggregate key
--   by a digest, so that the aggregate keeps one lane) and `unreadable` says which column and
--   how large; the row is dead-lettered with that reason;
-- * `occurred_at` NULL when the relay cannot represent it;
-- * `row_bytes`, what the row costs the relay in memory (the payload when loaded, headers and
--   the text columns), for the claim's byte budget.
e.id, e.event_id,
       CASE WHEN octet_length(e.aggregate_type) <= 4096 THEN e.aggregate_type
            ELSE 'oversized:' || md5(e.aggregate_type) END AS aggregate_type,
       CASE WHEN octet_length(e.aggregate_id) <= 4096 THEN e.aggregate_id
            ELSE 'oversized:' || md5(e.aggregate_id) END AS aggregate_id,
       e.aggregate_version,
       CASE WHEN octet_length(e.event_type) <= 4096 THEN e.event_type ELSE '' END AS event_type,
       e.schema_version,
       CASE WHEN octet_length(e.destination) <= 4096 THEN e.destination END AS destination,
       CASE WHEN octet_length(e.payload) <= {max_payload} THEN e.payload END AS payload,
       octet_length(e.payload)::bigint AS payload_size,
       CASE WHEN octet_length(e.content_type) <= 4096 THEN e.content_type ELSE '' END
           AS content_type,
       CASE WHEN octet_length(e.headers::text) <= 65536 THEN e.headers::text ELSE '{}' END
           AS headers,
       CASE WHEN octet_length(e.aggregate_type) > 4096
                THEN format('aggregate_type is %s bytes, over the limit of 4096 bytes',
                            octet_length(e.aggregate_type))
            WHEN octet_length(e.aggregate_id) > 4096
                THEN format('aggregate_id is %s bytes, over the limit of 4096 bytes',
                            octet_length(e.aggregate_id))
            WHEN octet_length(e.event_type) > 4096
                THEN format('event_type is %s bytes, over the limit of 4096 bytes',
                            octet_length(e.event_type))
            WHEN octet_length(e.destination) > 4096
                THEN format('destination is %s bytes, over the limit of 4096 bytes',
                            octet_length(e.destination))
            WHEN octet_length(e.content_type) > 4096
                THEN format('content_type is %s bytes, over the limit of 4096 bytes',
                            octet_length(e.content_type))
            WHEN octet_length(e.headers::text) > 65536
                THEN format('headers are %s bytes, over the limit of 65536 bytes',
                            octet_length(e.headers::text))
       END AS unreadable,
       CASE WHEN e.occurred_at > '-infinity' AND e.occurred_at < '262143-01-01 00:00:00+00'
            THEN e.occurred_at END AS occurred_at,
       e.partition, e.attempts, e.permanent_failures,
       (CASE WHEN octet_length(e.payload) <= {max_payload} THEN octet_length(e.payload) ELSE 0 END
        + least(pg_column_size(e.headers), 65536)
        + least(octet_length(e.aggregate_type), 4096) + least(octet_length(e.aggregate_id), 4096)
        + least(octet_length(e.event_type), 4096) + least(octet_length(e.content_type), 4096)
        + coalesce(least(octet_length(e.destination), 4096), 0))::bigint AS row_bytes
