-- A held event whose version was applied already (by another message of it): its row goes;
-- its inbox row stays, as for any duplicate. Returns 1 when the row was there to delete.
-- $1 id
WITH gone AS (DELETE FROM {schema}.consumer_held WHERE id = $1 RETURNING 1)
SELECT count(*) FROM gone
