-- Claims cost O(batch) whatever waits behind a hold. A pending row is *waiting* when its
-- `next_attempt_at` is set: the failed head of a held aggregate (until its retry), or a row
-- behind a hold ('infinity', until the relay releases the aggregate). The claim's partition
-- scan reads only pending rows that are not waiting, so the backlog of a parked or retrying
-- aggregate is not walked by every claim. Replaces `_pending`, which held every pending row.
CREATE INDEX {events_name}_claimable ON {schema}.{events} (partition, id)
    WHERE status = 'pending' AND next_attempt_at IS NULL;
-- Waiting rows by aggregate: what a release sets free, and the claim's one-probe check that no
-- earlier row of an aggregate is waiting (usually an empty index).
CREATE INDEX {events_name}_waiting ON {schema}.{events} (aggregate_type, aggregate_id, id)
    WHERE status = 'pending' AND next_attempt_at IS NOT NULL;
DROP INDEX {schema}.{events_name}_pending;
