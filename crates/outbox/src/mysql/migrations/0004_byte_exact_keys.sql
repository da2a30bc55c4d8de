-- Keys compare byte for byte. `utf8mb4_bin` is a PAD SPACE collation: 'a' and 'a ' were one
-- aggregate for `=`, the (aggregate, version) unique key (a false duplicate) and the holds'
-- key, while `CRC32` put them in different partitions; the inbox took message 'msg-1 ' for a
-- duplicate of 'msg-1'. The NO PAD binary collation of the server replaces it: MariaDB's
-- `utf8mb4_nopad_bin`, MySQL 8's `utf8mb4_0900_bin`.
--
-- Each table is changed only while a key column still has the old collation, so a migration
-- cut short completes on the next run. MariaDB changes the collation in place, writes going
-- on; MySQL 8 copies the table, and blocks writes to it while it does (on a large table,
-- apply this step with an online schema-change tool: `outbox migrate` then finds it done).
-- Each waits first for the transactions open on the table (the migrator gives way every 2 s). MariaDB drops a column's CHECK constraint that a MODIFY does not repeat, MySQL keeps
-- it as a table constraint (and would add a second): the CHECK is repeated on MariaDB only.
SET @outbox_nopad = IF(EXISTS (
        SELECT 1 FROM information_schema.collations WHERE collation_name = 'utf8mb4_nopad_bin'),
    'utf8mb4_nopad_bin', 'utf8mb4_0900_bin');
SET @outbox_maria = (@outbox_nopad = 'utf8mb4_nopad_bin');
SET @outbox_ddl = IF(EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = DATABASE() AND table_name = '{events}'
          AND column_name IN ('aggregate_type', 'aggregate_id') AND collation_name = 'utf8mb4_bin'),
    CONCAT('ALTER TABLE {events} ',
           'MODIFY aggregate_type VARCHAR(255) COLLATE ', @outbox_nopad, ' NOT NULL',
           IF(@outbox_maria, ' CHECK (aggregate_type <> '''')', ''), ', ',
           'MODIFY aggregate_id VARCHAR(255) COLLATE ', @outbox_nopad, ' NOT NULL',
           IF(@outbox_maria, ' CHECK (aggregate_id <> '''')', '')),
    'DO 0');
PREPARE outbox_step FROM @outbox_ddl;
EXECUTE outbox_step;
DEALLOCATE PREPARE outbox_step;
SET @outbox_ddl = IF(EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = DATABASE() AND table_name = '{holds}'
          AND column_name IN ('aggregate_type', 'aggregate_id') AND collation_name = 'utf8mb4_bin'),
    CONCAT('ALTER TABLE {holds} ',
           'MODIFY aggregate_type VARCHAR(255) COLLATE ', @outbox_nopad, ' NOT NULL, ',
           'MODIFY aggregate_id VARCHAR(255) COLLATE ', @outbox_nopad, ' NOT NULL'),
    'DO 0');
PREPARE outbox_step FROM @outbox_ddl;
EXECUTE outbox_step;
DEALLOCATE PREPARE outbox_step;
SET @outbox_ddl = IF(EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = DATABASE() AND table_name = '{events}_archive'
          AND column_name IN ('aggregate_type', 'aggregate_id') AND collation_name = 'utf8mb4_bin'),
    CONCAT('ALTER TABLE {events}_archive ',
           'MODIFY aggregate_type VARCHAR(255) COLLATE ', @outbox_nopad, ' NOT NULL, ',
           'MODIFY aggregate_id VARCHAR(255) COLLATE ', @outbox_nopad, ' NOT NULL'),
    'DO 0');
PREPARE outbox_step FROM @outbox_ddl;
EXECUTE outbox_step;
DEALLOCATE PREPARE outbox_step;
SET @outbox_ddl = IF(EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = DATABASE() AND table_name = '{inbox}'
          AND column_name IN ('consumer', 'event_id') AND collation_name = 'utf8mb4_bin'),
    CONCAT('ALTER TABLE {inbox} ',
           'MODIFY consumer VARCHAR(255) COLLATE ', @outbox_nopad, ' NOT NULL',
           IF(@outbox_maria, ' CHECK (consumer <> '''')', ''), ', ',
           'MODIFY event_id VARCHAR(255) COLLATE ', @outbox_nopad, ' NOT NULL'),
    'DO 0');
PREPARE outbox_step FROM @outbox_ddl;
EXECUTE outbox_step;
DEALLOCATE PREPARE outbox_step;
-- A hold written under the old collation may carry another key than its head row's: the
-- upsert of aggregate 'a ' met the hold of 'a' and moved it to its own head. Such a hold now
-- holds neither aggregate (it is never due, and a skip finds it by its key): each head row's
-- aggregate gets the hold it should have (unless it has one), then the mismatched ones go,
-- and the rows of 'a' waiting behind the lost hold are set free by the relay's sweep.
INSERT IGNORE INTO {holds} (aggregate_type, aggregate_id, `partition`, event_id, held_until,
                            created_at)
SELECT e.aggregate_type, e.aggregate_id, e.`partition`, e.id, h.held_until, h.created_at
FROM {holds} h JOIN {events} e ON e.id = h.event_id
WHERE h.aggregate_type <> e.aggregate_type OR h.aggregate_id <> e.aggregate_id;
DELETE h FROM {holds} h JOIN {events} e ON e.id = h.event_id
WHERE h.aggregate_type <> e.aggregate_type OR h.aggregate_id <> e.aggregate_id;
