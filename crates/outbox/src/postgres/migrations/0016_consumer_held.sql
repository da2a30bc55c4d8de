-- Events a consumer holds instead of applying at once, so that waiting never occupies the
-- broker's in-flight window: the message is stored here, in the consumer's own transaction,
-- and acknowledged. A row is held because an earlier event of its aggregate is not applied
-- yet (a version gap, or an earlier held event), because its aggregate was first seen at a
-- later version and waits for earlier ones to arrive, or because its handler failed and it
-- waits for its next attempt. Runners apply held rows in aggregate order as soon as they are
-- due; the row is deleted in the transaction that applies it (or once it is dead-lettered).
CREATE TABLE {schema}.consumer_held (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL CHECK (consumer <> ''),
    -- The inbox key of the message (its event id, or a producer's own id).
    message_id      text        NOT NULL CHECK (message_id <> ''),
    event_id        uuid        NOT NULL,
    event_type      text        NOT NULL,
    -- NULL for an event without an aggregate (held only for its next attempt).
    aggregate_type  text,
    aggregate_id    text,
    version         bigint,
    -- The message as received, to apply it later and to dead-letter it whole; its headers as
    -- a JSON object in bytes (a header value may hold a NUL, which jsonb refuses).
    destination     text        NOT NULL,
    headers         bytea       NOT NULL,
    payload         bytea       NOT NULL,
    record_key      bytea,
    held_at         timestamptz NOT NULL DEFAULT now(),
    -- When a runner may try it: NULL while it waits for an earlier event of its aggregate.
    next_attempt_at timestamptz,
    -- Failed attempts of its handler (the one before it was held included).
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- Tries started from here: a try that never ended (the process stopped or crashed during
    -- it) shows as one more try than attempts and commits.
    tries           integer     NOT NULL DEFAULT 0 CHECK (tries >= 0),
    last_error      text,
    -- Why it is held, in words, as of its last change (a dead one: why it is dead).
    reason          text        NOT NULL,
    -- Given up and being dead-lettered: no longer held (not counted, not applied, its inbox
    -- row gone so that a replay applies), kept only until its dead letter is stored.
    dead            boolean     NOT NULL DEFAULT false
);
-- One live row per message (a dead one does not stop its replay from being held).
CREATE UNIQUE INDEX consumer_held_message
    ON {schema}.consumer_held (consumer, message_id) WHERE NOT dead;
-- An aggregate's held rows in arrival order (the drain, the per-aggregate probe).
CREATE INDEX consumer_held_aggregate
    ON {schema}.consumer_held (consumer, aggregate_type, aggregate_id, id);
-- The rows due for a try.
CREATE INDEX consumer_held_due
    ON {schema}.consumer_held (consumer, next_attempt_at) WHERE next_attempt_at IS NOT NULL;

-- Per consumer and aggregate: the last version applied (NULL while none is), where the
-- consumer's versions of it start (`first_version`; versions below it were never this
-- consumer's to apply), whether an operator set that start (`seeded`), and how many of its
-- events are held. Locked by every transaction that applies or holds an event of the
-- aggregate, so holds and applications of one aggregate serialise.
ALTER TABLE {schema}.consumer_versions
    ALTER COLUMN version DROP NOT NULL,
    ADD COLUMN first_version bigint,
    ADD COLUMN seeded boolean NOT NULL DEFAULT false,
    ADD COLUMN held integer NOT NULL DEFAULT 0 CHECK (held >= 0);
