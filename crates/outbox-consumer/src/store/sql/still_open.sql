-- After a handler, whether the consumer's transaction is still the one it started (`same`).
-- A handler that ignored a statement's error left it aborted: this fails, where COMMIT would
-- roll everything back without an error. One that ran ROLLBACK or COMMIT itself left it: what
-- runs now is a transaction of its own (`same` false).
-- $1 the transaction, as the statement that started the event's work named it
SELECT pg_current_xact_id()::text = $1 AS same
