-- The outbox table: a public contract. Services in any language may INSERT into it directly;
-- only the columns up to `occurred_at` are theirs to write, the rest is the relay's state.
CREATE TABLE {schema}.{events} (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id          uuid        NOT NULL,
    aggregate_type    text        NOT NULL CHECK (aggregate_type <> ''),
    aggregate_id      text        NOT NULL CHECK (aggregate_id <> ''),
    aggregate_version bigint      CHECK (aggregate_version >= 0),
    event_type        text        NOT NULL CHECK (event_type <> ''),
    schema_version    integer     NOT NULL DEFAULT 1 CHECK (schema_version >= 1),
    destination       text,
    payload           bytea       NOT NULL,
    content_type      text        NOT NULL DEFAULT 'application/json',
    headers           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Relay state. `partition` is fixed by the partition count chosen at creation.
    partition         integer     NOT NULL GENERATED ALWAYS AS (
        ((hashtextextended(aggregate_type || ':' || aggregate_id, 0) & 2147483647)
            % {partitions})::integer
    ) STORED,
    status            text        NOT NULL DEFAULT 'pending'
                                  CHECK (status IN ('pending', 'published', 'dead')),
    attempts          integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz,
    last_error        text,
    published_at      timestamptz,
    CONSTRAINT {events_name}_event_id_key UNIQUE (event_id)
);

-- Optimistic concurrency: one event per (aggregate, version) when a version is given.
CREATE UNIQUE INDEX {events_name}_aggregate_version_key
    ON {schema}.{events} (aggregate_type, aggregate_id, aggregate_version)
    WHERE aggregate_version IS NOT NULL;

-- The relay's claim: pending rows of one partition in insertion order.
CREATE INDEX {events_name}_pending ON {schema}.{events} (partition, id) WHERE status = 'pending';

-- The lag gauge: age of the oldest pending event, without scanning the backlog.
CREATE INDEX {events_name}_pending_age ON {schema}.{events} (occurred_at) WHERE status = 'pending';

-- Operators list dead letters by aggregate.
CREATE INDEX {events_name}_dead ON {schema}.{events} (aggregate_type, aggregate_id)
    WHERE status = 'dead';

-- Partition leases. `epoch` increases on every takeover; every state change a relay writes is
-- conditional on the epoch it holds (fencing).
CREATE TABLE {schema}.leases (
    partition   integer     PRIMARY KEY,
    owner       text,
    epoch       bigint      NOT NULL DEFAULT 0,
    expires_at  timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz
);
INSERT INTO {schema}.leases (partition) SELECT generate_series(0, {partitions} - 1);

-- Live relay instances, for rebalancing partitions between them.
CREATE TABLE {schema}.relays (
    relay_id     text        PRIMARY KEY,
    hostname     text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- Aggregates whose head event failed: their later events wait until `held_until` (retry
-- backoff) or forever when NULL (the head is dead: the aggregate is parked).
CREATE TABLE {schema}.holds (
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    partition      integer     NOT NULL,
    event_id       bigint      NOT NULL,
    held_until     timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aggregate_type, aggregate_id)
);

CREATE TABLE {schema}.meta (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    partitions integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {schema}.meta (partitions) VALUES ({partitions});
