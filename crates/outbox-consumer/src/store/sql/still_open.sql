-- Fails when the transaction is aborted: a handler that ignored a statement's error leaves it
-- so, and COMMIT would then roll everything back without an error. Run after a handler when no
-- other statement of the consumer follows it.
SELECT 1
