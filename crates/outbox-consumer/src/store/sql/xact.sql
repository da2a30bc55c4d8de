-- The current transaction, named for `still_open.sql`.
SELECT pg_current_xact_id()::text
