-- The one-event-per-(aggregate, version) check of a time-partitioned outbox (a trigger: a
-- unique index of a partitioned table must hold the partition key). The row of the same
-- event, at the same time, is not another event: the event-id key decides for it, so that an
-- `INSERT … ON CONFLICT DO NOTHING` of an event already written (the CDC relay writing a
-- streamed event into the table again after a restart) does nothing, as on a plain table,
-- where the check raised a duplicate-version error first. Defined on every outbox (used by
-- the trigger a time-partitioned one has).
CREATE OR REPLACE FUNCTION {schema}.{events_name}_unique_version() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.aggregate_version IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(
            hashtextextended('outbox.version:' || NEW.aggregate_type || ':' || NEW.aggregate_id, 0));
        IF EXISTS (
            SELECT 1 FROM {schema}.{events}
            WHERE aggregate_type = NEW.aggregate_type
              AND aggregate_id = NEW.aggregate_id
              AND aggregate_version = NEW.aggregate_version
              AND NOT (event_id = NEW.event_id AND occurred_at = NEW.occurred_at)
        ) THEN
            RAISE EXCEPTION 'duplicate key value violates unique constraint "{events_name}_aggregate_version_key"'
                USING ERRCODE = 'unique_violation',
                      CONSTRAINT = '{events_name}_aggregate_version_key',
                      DETAIL = format('Key (aggregate_type, aggregate_id, aggregate_version)=(%s, %s, %s) already exists.',
                                      NEW.aggregate_type, NEW.aggregate_id, NEW.aggregate_version);
        END IF;
    END IF;
    RETURN NEW;
END
$fn$;
