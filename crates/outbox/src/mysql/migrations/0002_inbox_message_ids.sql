-- The inbox takes any text message id up to 255 characters (a CloudEvents `id`, another
-- producer's key), compared byte for byte, and records the event type applied.
--
-- Skipped when done (the event_type column is there): a migration cut short after the change
-- but before it was recorded completes on the next run.
SET @outbox_ddl = IF(EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = DATABASE() AND table_name = '{inbox}'
          AND column_name = 'event_type'),
    'DO 0',
    'ALTER TABLE {inbox}
         MODIFY event_id VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
         ADD COLUMN event_type VARCHAR(255) NULL,
         ADD CONSTRAINT {inbox}_event_id_not_empty CHECK (event_id <> '''')');
PREPARE outbox_step FROM @outbox_ddl;
EXECUTE outbox_step;
DEALLOCATE PREPARE outbox_step;
