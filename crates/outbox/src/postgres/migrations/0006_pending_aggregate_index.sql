-- The relay's claim scans a partition from a floor (the lowest id its previous claim found
-- pending) and must not publish an aggregate's row while an earlier row of that aggregate is
-- still pending below the floor, as happens when a transaction commits late. This index answers
-- "does this aggregate have a pending row below the floor?" with one probe.
CREATE INDEX {events_name}_pending_aggregate ON {schema}.{events} (aggregate_type, aggregate_id, id)
    WHERE status = 'pending';
