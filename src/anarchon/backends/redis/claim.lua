-- claim: become the runner of one slot (Backend.claim). Idempotent per token.
-- A: job, slot_key, slot (absent for a manual run), run_id, token, instance, trigger,
--    lease_ms, overlap ('skip' or 'allow'), skip_reason and skip_status (optional),
--    requested_by (optional), pausable (true unless the trigger is manual), restart_margin_ms,
--    claims_channel (optional: where a won claim is announced; a batch of several claims is
--    announced by the caller instead, in one message), and on a Redis Cluster pauses (the stored pauses of the job and of '*', read just before).
-- KEYS[6] (not on a cluster): the pauses hash (field: job name or '*'; value: the pause as
-- JSON with its rendered reason), read here so a stored pause holds every later claim.
local PAUSES = KEYS[6]

-- Python's datetime.isoformat() of an aware UTC datetime, for the reasons we record.
local function iso(ms)
  local secs = math.floor(ms / 1000)
  local milli = ms - secs * 1000
  local days = math.floor(secs / 86400)
  local rem = secs - days * 86400
  -- Days to civil date (Howard Hinnant's algorithm), valid from 0000-03-01 on.
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400
  if month <= 2 then
    year = year + 1
  end
  local out = string.format('%04d-%02d-%02dT%02d:%02d:%02d', year, month, day,
    math.floor(rem / 3600), math.floor((rem % 3600) / 60), rem % 60)
  if milli ~= 0 then
    out = out .. string.format('.%06d', milli * 1000)
  end
  return out .. '+00:00'
end

local function describe(row)
  if not row.slot then
    return 'manual'
  end
  return 'slot ' .. iso(row.slot)
end

-- The first recorded attempt of the job running under a live lease that was not released
-- (ids rise in the order attempts are recorded), and the stale entries met on the way, to be
-- removed after this script's first (deny-OOM) write.
local function live_holder()
  local ids = redis.call('ZRANGEBYSCORE', LEASES, '(' .. int(NOW), '+inf')
  local best, stale = nil, {}
  for _, id in ipairs(ids) do
    local row = load(id)
    if row and row.status == 'running' and not row.released then
      if not best or id < best.id then
        best = row
      end
    else
      stale[#stale + 1] = id
    end
  end
  return best, stale
end

-- An answer for a slot this data set cannot vouch for; nothing is stored.
local function refuse(reason)
  return reply({status = 'lost', refused = true, run = {
    job = A.job, slot_key = A.slot_key, slot = A.slot, attempt = 1, run_id = A.run_id,
    token = '', instance = A.instance, trigger = A.trigger, status = 'skipped', fence = 0,
    started_at = NOW, reason = reason, requested_by = A.requested_by,
  }})
end

local existing = current(A.slot_key)
if existing then
  if (existing.status == 'skipped' or existing.status == 'missed') and existing.attempt == 1 then
    return reply({status = 'skipped', run = existing})
  end
  if existing.token == A.token and existing.attempt == 1 and existing.status == 'running'
      and not existing.released then
    -- A retried claim; once attempt 1 has ended it is LOST, so no handler starts on a run
    -- that history shows as over.
    return reply({status = 'won', run = existing})
  end
  local lost = {status = 'lost', run = existing}
  if existing.status == 'running' then
    lost.expires = existing.lease_expires_at
  end
  return reply(lost)
end

if redis.call('EXISTS', META) == 0 then
  -- The first record of this job in this data set. Slots from before this server started
  -- are unknown to it: after a restart without persistence they may have run already, so
  -- they are refused (fail closed) rather than run a second time. The margin covers the
  -- one-second resolution of the uptime and small clock skew between instances and Redis.
  local info = redis.pcall('INFO', 'server')
  local uptime = type(info) == 'string' and tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
  if uptime then
    local started = (math.floor(NOW / 1000) - uptime) * 1000
    redis.call('HSET', META, 'known_from', int(started + A.restart_margin_ms))
  end
end

if A.slot then
  local pruned = tonumber(redis.call('HGET', META, 'pruned_through'))
  if pruned and A.slot <= pruned then
    return refuse("too old: the job's history is pruned past this slot")
  end
  local known = tonumber(redis.call('HGET', META, 'known_from'))
  if known and A.slot < known then
    return refuse('unknown: Redis holds no record of this job before ' .. iso(known)
      .. ' (it restarted without its data), so the slot may have run already; not run again')
  end
end

-- The pause that holds this claim: the job's own, else the whole cluster's ('*'); active while
-- it has no end or NOW is before it (this server's clock).
local function active_pause()
  for _, name in ipairs({A.job, '*'}) do
    local raw
    if PAUSES then
      raw = redis.call('HGET', PAUSES, name)
    else
      raw = A.pauses and A.pauses[name]
    end
    if raw then
      local pause = cjson.decode(raw)
      local ends = tonumber(pause.until_ms)
      if not ends or NOW < ends then
        return pause
      end
    end
  end
  return nil
end

-- The reason anarchon.control.paused_reason gives (pause() stores it with the pause).
local function paused_reason(pause)
  if type(pause.reason) == 'string' then
    return pause.reason
  end
  local out = 'paused by ' .. tostring(pause.by)
  if pause.job == '*' then
    out = out .. ' (all jobs)'
  end
  if tonumber(pause.until_ms) then
    out = out .. ' until ' .. iso(tonumber(pause.until_ms))
  end
  return out
end

local reason = A.skip_reason
local status = reason and (A.skip_status or 'skipped') or 'skipped'
if not reason and A.pausable then
  local pause = active_pause()
  if pause then
    reason = paused_reason(pause)
  end
end
local stale = {}
if not reason and A.overlap == 'skip' then
  local holder
  holder, stale = live_holder()
  if holder then
    reason = 'overlap: run ' .. holder.run_id .. ' (' .. describe(holder)
      .. ') still holds its lease'
  end
end

local row = {
  job = A.job, slot_key = A.slot_key, slot = A.slot, attempt = 1, run_id = A.run_id,
  token = A.token, instance = A.instance, trigger = A.trigger, started_at = NOW,
  requested_by = A.requested_by,
}
if reason then
  row.status = status
  row.fence = 0
  row.reason = reason
  row.finished_at = NOW
  insert(row)
else
  row.status = 'running'
  row.fence = next_fence()
  row.lease_expires_at = NOW + A.lease_ms
  insert(row)
end
for _, id in ipairs(stale) do
  redis.call('ZREM', LEASES, id)
end
if not reason and A.claims_channel then
  -- A claim notice, so instances still waiting their rank delay do not claim. pcall: a user
  -- whose ACL refuses the channel still claims (the others then claim and lose).
  redis.pcall('PUBLISH', A.claims_channel,
    cjson.encode({row.job, row.slot_key, row.instance, row.lease_expires_at}))
end
return reply({status = row.status == 'running' and 'won' or 'skipped', run = row})
