-- Orchestrated sagas: one row per saga instance, changed only inside a saga step's transaction
-- (inbox check + transition + new state + emitted events, committed together).
CREATE TABLE {schema}.sagas (
    saga_type      text        NOT NULL CHECK (saga_type <> ''),
    correlation_id text        NOT NULL CHECK (correlation_id <> ''),
    state          text        NOT NULL CHECK (state <> ''),
    data           jsonb       NOT NULL,
    -- Optimistic concurrency: every step writes `version + 1` where `version` is what it read.
    version        bigint      NOT NULL DEFAULT 1 CHECK (version >= 1),
    -- When the current state times out (NULL: it never does). Cleared in final states.
    deadline       timestamptz,
    finished       boolean     NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (saga_type, correlation_id)
);

-- The timeout scheduler's scan: instances whose deadline has passed.
CREATE INDEX sagas_deadline ON {schema}.sagas (deadline) WHERE deadline IS NOT NULL;
-- `outbox sagas list`: the most recently changed first, by type and state.
CREATE INDEX sagas_type_state ON {schema}.sagas (saga_type, state, updated_at);

-- Every step of every instance, including the events a saga did not expect: nothing it receives
-- is silently dropped. Written in the step's own transaction.
CREATE TABLE {schema}.saga_steps (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    saga_type      text        NOT NULL,
    correlation_id text        NOT NULL,
    at             timestamptz NOT NULL DEFAULT now(),
    -- The event that drove the step (NULL for a timeout).
    event_id       uuid,
    trigger        text        NOT NULL,
    from_state     text,
    to_state       text,
    -- started | transitioned | ignored | unexpected | finished_already | timed_out
    outcome        text        NOT NULL,
    emitted        uuid[]      NOT NULL DEFAULT '{}',
    detail         text
);
CREATE INDEX saga_steps_instance ON {schema}.saga_steps (saga_type, correlation_id, id);
CREATE INDEX saga_steps_outcome ON {schema}.saga_steps (outcome, at)
    WHERE outcome IN ('unexpected', 'finished_already', 'orphan');
