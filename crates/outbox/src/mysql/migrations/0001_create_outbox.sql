-- The MySQL / MariaDB outbox: the same contract as PostgreSQL's, in tables prefixed with the
-- schema name, in the connection's database. Every statement ends a line with `;` and is run
-- on its own (MySQL commits DDL as it goes): each one is written to be run again safely, so a
-- migration cut short by a crash completes on the next run.
--
-- Text is utf8mb4. Aggregate keys and consumer names have the binary collation: they compare
-- byte for byte, as on PostgreSQL ('A' and 'a' are two aggregates, not one).
CREATE TABLE IF NOT EXISTS {events} (
    id                 BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id           CHAR(36)      NOT NULL,
    aggregate_type     VARCHAR(255) COLLATE utf8mb4_bin NOT NULL CHECK (aggregate_type <> ''),
    aggregate_id       VARCHAR(255) COLLATE utf8mb4_bin NOT NULL CHECK (aggregate_id <> ''),
    aggregate_version  BIGINT        NULL CHECK (aggregate_version >= 0),
    event_type         VARCHAR(255)  NOT NULL CHECK (event_type <> ''),
    schema_version     INT           NOT NULL DEFAULT 1 CHECK (schema_version >= 1),
    destination        VARCHAR(4096) NULL,
    payload            LONGBLOB      NOT NULL,
    content_type       VARCHAR(255)  NOT NULL DEFAULT 'application/json',
    headers            JSON          NOT NULL DEFAULT ('{}'),
    occurred_at        DATETIME(6)   NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- Relay state. `partition` is fixed by the partition count chosen at creation.
    `partition`        INT AS (CRC32(CONCAT(aggregate_type, ':', aggregate_id)) % {partitions})
                           STORED,
    status             VARCHAR(16)   NOT NULL DEFAULT 'pending'
                                     CHECK (status IN ('pending', 'published', 'dead')),
    attempts           INT           NOT NULL DEFAULT 0,
    permanent_failures INT           NOT NULL DEFAULT 0,
    -- NULL: claimable. Set: retrying (the time is the hold's) or waiting behind a held row
    -- of its aggregate ('9999-12-31').
    next_attempt_at    DATETIME(6)   NULL,
    last_error         TEXT          NULL,
    published_at       DATETIME(6)   NULL,
    -- Sizes the claim reads to fit a batch to the relay's memory budget without loading the
    -- payload (a BLOB's length is not free on InnoDB).
    payload_bytes      BIGINT AS (LENGTH(payload)) STORED,
    headers_bytes      BIGINT AS (LENGTH(headers)) STORED,
    UNIQUE KEY {events}_event_id_key (event_id),
    -- Optimistic concurrency: one event per (aggregate, version) when a version is given
    -- (MySQL lets any number of NULL versions through a unique key).
    UNIQUE KEY {events}_aggregate_version_key (aggregate_type, aggregate_id, aggregate_version),
    -- The claim: each partition's claimable rows in id order.
    KEY {events}_claimable (status, next_attempt_at, `partition`, id),
    -- The claim's checks on an aggregate's earlier rows, and setting its waiting rows free.
    KEY {events}_aggregate (aggregate_type, aggregate_id, status, id),
    -- The purge: published rows by age.
    KEY {events}_published_at (status, published_at),
    -- The lag gauge: the oldest pending row.
    KEY {events}_status_age (status, occurred_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS {leases} (
    `partition` INT          NOT NULL PRIMARY KEY,
    owner       VARCHAR(255) NULL,
    epoch       BIGINT       NOT NULL DEFAULT 0,
    expires_at  BIGINT       NOT NULL DEFAULT 0,   -- unix milliseconds
    acquired_at BIGINT       NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS {relays} (
    relay_id     VARCHAR(255) NOT NULL PRIMARY KEY,
    hostname     VARCHAR(255) NOT NULL,
    started_at   BIGINT       NOT NULL,
    heartbeat_at BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS {holds} (
    aggregate_type VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    aggregate_id   VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    `partition`    INT          NOT NULL,
    event_id       BIGINT       NOT NULL,
    held_until     BIGINT       NULL,                 -- unix milliseconds; NULL: parked
    created_at     BIGINT       NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id),
    KEY {holds}_due (`partition`, held_until),
    KEY {holds}_event (event_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS {meta} (
    singleton  INT NOT NULL PRIMARY KEY CHECK (singleton = 1),
    partitions INT NOT NULL
) ENGINE = InnoDB;
INSERT IGNORE INTO {meta} (singleton, partitions) VALUES (1, {partitions});

CREATE TABLE IF NOT EXISTS {inbox} (
    consumer     VARCHAR(255) COLLATE utf8mb4_bin NOT NULL CHECK (consumer <> ''),
    event_id     CHAR(36)     NOT NULL,
    processed_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, event_id),
    KEY {inbox}_processed_at (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Every operator action that changes event state (dead-letter replay, skip), written in the
-- transaction that performs it. `event_ids` is a JSON array of row ids.
CREATE TABLE IF NOT EXISTS {audit} (
    id        BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at        DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    actor     VARCHAR(255) NOT NULL,
    action    VARCHAR(64)  NOT NULL,
    event_ids JSON         NOT NULL,
    reason    TEXT         NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- The events table's columns, without its constraints: archived rows are kept, not relayed.
CREATE TABLE IF NOT EXISTS {events}_archive (
    id                 BIGINT        NOT NULL PRIMARY KEY,
    event_id           CHAR(36)      NOT NULL,
    aggregate_type     VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    aggregate_id       VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    aggregate_version  BIGINT        NULL,
    event_type         VARCHAR(255)  NOT NULL,
    schema_version     INT           NOT NULL,
    destination        VARCHAR(4096) NULL,
    payload            LONGBLOB      NOT NULL,
    content_type       VARCHAR(255)  NOT NULL,
    headers            JSON          NOT NULL,
    occurred_at        DATETIME(6)   NOT NULL,
    `partition`        INT           NOT NULL,
    status             VARCHAR(16)   NOT NULL,
    attempts           INT           NOT NULL,
    permanent_failures INT           NOT NULL,
    next_attempt_at    DATETIME(6)   NULL,
    last_error         TEXT          NULL,
    published_at       DATETIME(6)   NULL,
    KEY {events}_archive_published_at (published_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
