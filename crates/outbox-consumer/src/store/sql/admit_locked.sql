-- Admits an event of an aggregate: records it in the consumer's inbox (`new` is false when the
-- inbox had it) and locks the aggregate's version state. When the event is new and its
-- version $6 is the one the gate applies next with nothing of the aggregate held (the
-- aggregate's last version is $6 - 1, or it has no state row and $6 is the gate's start $7),
-- it also records $6 as applied (`applied`): the caller runs the handler and commits, one round
-- trip fewer than a separate advance. Otherwise (`applied` false) it returns the state, locked;
-- no state row (`known` false): nothing of the aggregate applied or held yet. $6 and $7 are
-- NULL when the gate does not order the event: it is never applied here. $6 is above
-- bigint's minimum when set ($6 - 1 must not overflow). A state row that a
-- concurrent first event inserts after this statement began is neither seen nor overwritten
-- (`applied` false, `known` false): the caller's advance then finds it and tries again.
-- $1 consumer, $2 message id, $3 event type, $4 aggregate type, $5 aggregate id,
-- $6 version, $7 the gate's first version
WITH seen AS (
    INSERT INTO {schema}.inbox (consumer, event_id, event_type) VALUES ($1, $2, $3)
    ON CONFLICT (consumer, event_id) DO NOTHING
    RETURNING 1
), advanced AS (
    UPDATE {schema}.consumer_versions
    SET version = $6, first_version = coalesce(first_version, $6), updated_at = now()
    WHERE consumer = $1 AND aggregate_type = $4 AND aggregate_id = $5
      AND version = $6 - 1 AND held = 0
      AND EXISTS (SELECT 1 FROM seen)
    RETURNING 1
), started AS (
    INSERT INTO {schema}.consumer_versions
        (consumer, aggregate_type, aggregate_id, version, first_version)
    SELECT $1, $4, $5, $6, $6
    WHERE $6 = $7
      AND EXISTS (SELECT 1 FROM seen)
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.consumer_versions
          WHERE consumer = $1 AND aggregate_type = $4 AND aggregate_id = $5
      )
    ON CONFLICT (consumer, aggregate_type, aggregate_id) DO NOTHING
    RETURNING 1
), state AS (
    SELECT version, first_version, seeded, held
    FROM {schema}.consumer_versions
    WHERE consumer = $1 AND aggregate_type = $4 AND aggregate_id = $5
      AND NOT EXISTS (SELECT 1 FROM advanced)
      AND NOT EXISTS (SELECT 1 FROM started)
    FOR UPDATE
)
SELECT EXISTS (SELECT 1 FROM seen) AS new,
       EXISTS (SELECT 1 FROM advanced) OR EXISTS (SELECT 1 FROM started) AS applied,
       EXISTS (SELECT 1 FROM state) AS known,
       (SELECT version FROM state) AS version,
       (SELECT first_version FROM state) AS first_version,
       coalesce((SELECT seeded FROM state), false) AS seeded,
       coalesce((SELECT held FROM state), 0) AS held
