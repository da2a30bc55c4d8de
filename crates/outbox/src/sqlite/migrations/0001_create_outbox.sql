-- The SQLite outbox: the same contract as PostgreSQL's, in tables prefixed with the schema
-- name. SQLite runs one relay at a time, so there is a single partition (0).
CREATE TABLE {events} (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id          TEXT    NOT NULL UNIQUE,
    aggregate_type    TEXT    NOT NULL CHECK (aggregate_type <> ''),
    aggregate_id      TEXT    NOT NULL CHECK (aggregate_id <> ''),
    aggregate_version INTEGER CHECK (aggregate_version >= 0),
    event_type        TEXT    NOT NULL CHECK (event_type <> ''),
    schema_version    INTEGER NOT NULL DEFAULT 1 CHECK (schema_version >= 1),
    destination       TEXT,
    payload           BLOB    NOT NULL,
    content_type      TEXT    NOT NULL DEFAULT 'application/json',
    headers           TEXT    NOT NULL DEFAULT '{}',
    occurred_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    partition         INTEGER NOT NULL DEFAULT 0,
    status            TEXT    NOT NULL DEFAULT 'pending'
                              CHECK (status IN ('pending', 'published', 'dead')),
    attempts          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   TEXT,
    last_error        TEXT,
    published_at      TEXT
);
CREATE UNIQUE INDEX {events}_aggregate_version_key
    ON {events} (aggregate_type, aggregate_id, aggregate_version)
    WHERE aggregate_version IS NOT NULL;
CREATE INDEX {events}_pending ON {events} (partition, id) WHERE status = 'pending';
CREATE INDEX {events}_pending_age ON {events} (occurred_at) WHERE status = 'pending';

CREATE TABLE {leases} (
    partition   INTEGER PRIMARY KEY,
    owner       TEXT,
    epoch       INTEGER NOT NULL DEFAULT 0,
    expires_at  INTEGER NOT NULL DEFAULT 0,   -- unix milliseconds
    acquired_at INTEGER
);
INSERT INTO {leases} (partition) VALUES (0);

CREATE TABLE {relays} (
    relay_id     TEXT    PRIMARY KEY,
    hostname     TEXT    NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL
);

CREATE TABLE {holds} (
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    partition      INTEGER NOT NULL,
    event_id       INTEGER NOT NULL,
    held_until     INTEGER,                 -- unix milliseconds; NULL: parked
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

CREATE TABLE {meta} (
    singleton  INTEGER PRIMARY KEY CHECK (singleton = 1),
    partitions INTEGER NOT NULL
);
INSERT INTO {meta} (singleton, partitions) VALUES (1, 1);

CREATE TABLE {inbox} (
    consumer     TEXT NOT NULL CHECK (consumer <> ''),
    event_id     TEXT NOT NULL,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX {inbox}_processed_at ON {inbox} (processed_at);
