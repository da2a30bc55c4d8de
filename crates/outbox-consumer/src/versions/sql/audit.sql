-- Records an operator's change to a consumer's versions.
-- $1 actor, $2 action, $3 reason, $4 details
INSERT INTO {schema}.audit (actor, action, event_ids, reason, details)
VALUES ($1, $2, '{}', $3, $4)
