-- Shared by the completion statements (inlined as the `fence` CTE): the partitions whose lease
-- this relay still holds at the epoch it claimed with. FOR SHARE makes a concurrent takeover
-- wait for this statement's transaction, so a relay that lost its lease can never overwrite
-- its successor's work. Every statement that locks several lease rows locks them in partition
-- order, whatever its plan (a mark and a renewal that locked in two orders deadlocked, and
-- PostgreSQL saw it only after `deadlock_timeout`: deliveries stalled for a second).
SELECT l.partition
FROM {schema}.leases l
JOIN unnest($2::integer[], $3::bigint[]) AS f(partition, epoch)
  ON l.partition = f.partition AND l.epoch = f.epoch
WHERE l.owner = $4
ORDER BY l.partition
FOR SHARE OF l
