-- The claim's check that no earlier row of an aggregate is pending below the scan floor.
CREATE INDEX {events}_pending_aggregate ON {events} (aggregate_type, aggregate_id, id)
    WHERE status = 'pending';
