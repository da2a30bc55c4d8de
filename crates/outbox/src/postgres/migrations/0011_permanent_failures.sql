-- Permanent failures so far, counted apart from `attempts` (which counts every attempt:
-- transient failures and the successful one too). Only permanent failures lead to a dead
-- letter (after `retry.max_attempts` of them), so a broker outage that an event waits out does
-- not use up its budget: the first permanent error after the outage is retried like any other.
ALTER TABLE {schema}.{events} ADD COLUMN permanent_failures integer NOT NULL DEFAULT 0;
ALTER TABLE {schema}.{events_name}_archive ADD COLUMN permanent_failures integer NOT NULL DEFAULT 0;
