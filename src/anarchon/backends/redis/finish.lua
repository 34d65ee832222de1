-- finish: record the result of the attempt A holds (Backend.finish), then prune the job's
-- history by age (A.history_ttl_ms) and count (A.history_size), and wake the backups.
-- A: slot_key, token, fence, status, error (optional), history_ttl_ms (optional),
--    history_size, prune_batch, channel.
local done = current(A.slot_key)
if done and done.token == A.token and done.fence == A.fence and done.status == A.status then
  return reply({run = done}) -- a retry whose first answer was lost: already recorded
end
local row, answer = held()
if not row then
  return answer
end
row.status = A.status
row.error = A.error
row.finished_at = NOW
row.lease_expires_at = nil
save(row)
redis.call('ZREM', LEASES, row.id)

-- Pruning removes finished attempts only, at most prune_batch per call so a script stays
-- short; the newest slot it removes raises pruned_through, below which claims are refused.
local pruned_max = nil
local function drop(id)
  local victim = load(id)
  if victim and victim.status == 'running' then
    return
  end
  redis.call('HDEL', RUNS, id)
  redis.call('ZREM', ORDER, id)
  redis.call('ZREM', LEASES, id)
  if victim then
    if redis.call('HGET', SLOTS, victim.slot_key) == id then
      redis.call('HDEL', SLOTS, victim.slot_key)
    end
    if victim.slot and (not pruned_max or victim.slot > pruned_max) then
      pruned_max = victim.slot
    end
  end
end
if A.history_ttl_ms then
  local cutoff = '(' .. int(NOW - A.history_ttl_ms)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', ORDER, '-inf', cutoff, 'LIMIT', 0,
      A.prune_batch)) do
    drop(id)
  end
end
local excess = redis.call('ZCARD', ORDER) - A.history_size
if excess > 0 then
  for _, id in ipairs(redis.call('ZRANGE', ORDER, 0, math.min(excess, A.prune_batch) - 1)) do
    drop(id)
  end
end
if pruned_max then
  local old = tonumber(redis.call('HGET', META, 'pruned_through'))
  if not old or pruned_max > old then
    redis.call('HSET', META, 'pruned_through', int(pruned_max))
  end
end

notify(row, false)
return reply({run = row})
