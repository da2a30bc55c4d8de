-- A given-up event's dead letter is stored: its row goes.
-- $1 id
DELETE FROM {schema}.consumer_held WHERE id = $1 AND dead
