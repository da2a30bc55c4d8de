-- As PostgreSQL's migration 0012: the claim scans pending rows that are not waiting
-- (`next_attempt_at` unset); rows waiting behind a hold are indexed apart, by aggregate.
CREATE INDEX {events}_claimable ON {events} (partition, id)
    WHERE status = 'pending' AND next_attempt_at IS NULL;
CREATE INDEX {events}_waiting ON {events} (aggregate_type, aggregate_id, id)
    WHERE status = 'pending' AND next_attempt_at IS NOT NULL;
DROP INDEX {events}_pending;
