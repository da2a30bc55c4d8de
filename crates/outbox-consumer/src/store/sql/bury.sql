-- A held event is given up, to be dead-lettered: no longer held (the caller counts it off its
-- aggregate), its inbox row gone so that a replay applies, kept only until its dead letter
-- is stored (the runner that gave it up stores it now; $3 seconds from now any runner's
-- sweeper does, if that one did not). Returns 1 when this call gave it up.
-- $1 id, $2 the dead letter's reason, $3 seconds
WITH dead AS (
    UPDATE {schema}.consumer_held
    SET dead = true, reason = $2, next_attempt_at = now() + make_interval(secs => $3)
    WHERE id = $1 AND NOT dead
    RETURNING consumer, message_id
), forgotten AS (
    DELETE FROM {schema}.inbox
    USING dead
    WHERE inbox.consumer = dead.consumer AND inbox.event_id = dead.message_id
)
SELECT count(*) FROM dead
