-- Permanent failures so far, counted apart from `attempts` (every attempt): only permanent
-- failures lead to a dead letter, so a broker outage does not use up an event's budget.
ALTER TABLE {events} ADD COLUMN permanent_failures INTEGER NOT NULL DEFAULT 0;
