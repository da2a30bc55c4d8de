-- After a handler, whether the consumer's transaction is still the one it started (`same`), and
-- if not, how that one ended (`status`: `committed` when the handler ran COMMIT itself,
-- `aborted` after its ROLLBACK). A handler that ignored a statement's error left it aborted:
-- this fails, where COMMIT would roll everything back without an error.
-- $1 the transaction, as the statement that started the event's work named it
SELECT pg_current_xact_id()::text = $1 AS same,
       CASE WHEN pg_current_xact_id()::text <> $1 THEN pg_xact_status($1::xid8) END AS status
