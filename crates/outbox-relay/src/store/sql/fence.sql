-- Shared by the completion statements (inlined as the `fence` CTE): the partitions whose lease
-- this relay still holds at the epoch it claimed with. FOR SHARE makes a concurrent takeover
-- wait for this statement's transaction, so a relay that lost its lease can never overwrite
-- its successor's work.
SELECT l.partition
FROM {schema}.leases l
JOIN unnest($2::integer[], $3::bigint[]) AS f(partition, epoch)
  ON l.partition = f.partition AND l.epoch = f.epoch
WHERE l.owner = $4
FOR SHARE OF l
