-- Where in the replication stream the CDC relay handed an aggregate's first event to the table
-- path (the commit position of its transaction, and the event's own position in it). After a
-- restart the stream resends what was not confirmed: an event of a held aggregate from before
-- that position was settled before the hold (published), and is not written into the table
-- again behind it. NULL for holds the polling relay or an operator made.
ALTER TABLE {schema}.holds ADD COLUMN stream_commit_lsn bigint, ADD COLUMN stream_change_lsn bigint;
