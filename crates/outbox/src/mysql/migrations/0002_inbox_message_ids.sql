-- The inbox takes any text message id up to 255 characters (a CloudEvents `id`, another
-- producer's key), compared byte for byte, and records the event type applied.
ALTER TABLE {inbox}
    MODIFY event_id VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    ADD COLUMN event_type VARCHAR(255) NULL,
    ADD CONSTRAINT {inbox}_event_id_not_empty CHECK (event_id <> '');
