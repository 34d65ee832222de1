-- finish: record the result of the attempt A holds (Backend.finish), then prune the job's
-- history (the rules of anarchon.kit.lease) and wake the backups.
-- A: slot_key, attempt, token, fence, status, error (optional), history_ttl_ms (optional),
--    history_size, prune_batch, prune_scan, channel (optional: without it the caller announces
--    the finishes of a batch itself, in one message; see _backend.py), retry_id and retry
--    (optional: a failed run's retry, its id and its JSON, stored with HSETNX in the requests
--    hash, KEYS[6], when this script accepts the result; on a cluster the caller stores it
--    itself, before, as the requests hash lies in another slot).
local function main()
  local done = current(A.slot_key)
  local row = nil
  if done and done.attempt == A.attempt and done.token == A.token and done.fence == A.fence
      and done.status == A.status and done.error == A.error and not done.reason then
    -- A retry whose first answer was lost: already recorded. Written again as it is, so that
    -- this script's first write is a deny-OOM one like every other's.
    row = done
    save(row)
  else
    local answer
    row, answer = held()
    if not row then
      return answer
    end
    row.status = A.status
    row.error = A.error
    row.finished_at = NOW
    row.lease_expires_at = nil
    save(row)
    redis.call('ZREM', LEASES, row.id)
    if A.retry_id and KEYS[6] then
      redis.call('HSETNX', KEYS[6], A.retry_id, A.retry)
    end
    if A.channel then
      notify(row, false)
    end
  end

  -- Pruning: whole slots, never this one nor one whose latest attempt runs; those that ended
  -- before now - history_ttl_ms (oldest first), then the oldest ended ones while the job holds
  -- more than history_size slots; at most prune_batch slots, looking at most at prune_scan
  -- entries of ORDER. The newest pruned slot raises pruned_through.
  local victims, chosen, orphans = {}, {}, {}
  local cutoff = A.history_ttl_ms and (NOW - A.history_ttl_ms) or nil
  local function consider(id, aged)
    local victim = load(id)
    if not victim then
      orphans[#orphans + 1] = id
      return false
    end
    local current_id = redis.call('HGET', SLOTS, victim.slot_key)
    if not current_id then
      orphans[#orphans + 1] = id -- an attempt of a slot already dropped (older data)
      return false
    end
    if victim.attempt ~= 1 or victim.slot_key == A.slot_key or chosen[victim.slot_key] then
      return false
    end
    local latest = load(current_id)
    if not latest or latest.status == 'running' then
      return false
    end
    if aged and not (latest.finished_at and latest.finished_at < cutoff) then
      return false
    end
    chosen[victim.slot_key] = true
    victims[#victims + 1] = victim.slot_key
    return true
  end
  local total = redis.call('HLEN', SLOTS)
  if cutoff then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', ORDER, '-inf', '(' .. int(cutoff), 'LIMIT', 0,
        A.prune_scan)) do
      if #victims >= A.prune_batch then
        break
      end
      consider(id, true)
    end
  end
  local room = math.min(A.prune_batch, total - A.history_size) - #victims
  local start = 0
  while room > 0 and start < A.prune_scan do
    local ids = redis.call('ZRANGE', ORDER, start, start + 99)
    if #ids == 0 then
      break
    end
    for _, id in ipairs(ids) do
      if room <= 0 then
        break
      end
      if consider(id, false) then
        room = room - 1
      end
    end
    start = start + 100
  end
  local pruned_max = nil
  for _, slot_key in ipairs(victims) do
    local slot = drop_slot(slot_key)
    if slot and (not pruned_max or slot > pruned_max) then
      pruned_max = slot
    end
  end
  for _, id in ipairs(orphans) do
    redis.call('HDEL', RUNS, id)
    redis.call('ZREM', ORDER, id)
    redis.call('ZREM', LEASES, id)
  end
  if pruned_max then
    local old = tonumber(redis.call('HGET', META, 'pruned_through'))
    if not old or pruned_max > old then
      redis.call('HSET', META, 'pruned_through', int(pruned_max))
    end
  end
  return reply({run = row})
end
