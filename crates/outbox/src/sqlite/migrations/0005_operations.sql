-- The operations PostgreSQL's migrations 0003 and 0004 add: the purge's index, the audit of
-- operator actions, and the archive `outbox purge --archive` moves published rows into.

-- The purge finds published rows by age, oldest first, without scanning the table.
CREATE INDEX {events}_published_at ON {events} (published_at) WHERE status = 'published';

-- Every operator action that changes event state (dead-letter replay, skip), written in the
-- transaction that performs it. `event_ids` is a JSON array of row ids.
CREATE TABLE {audit} (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    actor     TEXT    NOT NULL,
    action    TEXT    NOT NULL,
    event_ids TEXT    NOT NULL,
    reason    TEXT    NOT NULL
);

-- The events table's columns, without its constraints: archived rows are kept, not relayed.
CREATE TABLE {events}_archive (
    id                 INTEGER PRIMARY KEY,
    event_id           TEXT    NOT NULL,
    aggregate_type     TEXT    NOT NULL,
    aggregate_id       TEXT    NOT NULL,
    aggregate_version  INTEGER,
    event_type         TEXT    NOT NULL,
    schema_version     INTEGER NOT NULL,
    destination        TEXT,
    payload            BLOB    NOT NULL,
    content_type       TEXT    NOT NULL,
    headers            TEXT    NOT NULL,
    occurred_at        TEXT    NOT NULL,
    partition          INTEGER NOT NULL,
    status             TEXT    NOT NULL,
    attempts           INTEGER NOT NULL,
    next_attempt_at    TEXT,
    last_error         TEXT,
    published_at       TEXT,
    permanent_failures INTEGER NOT NULL
);
CREATE INDEX {events}_archive_published_at ON {events}_archive (published_at);
