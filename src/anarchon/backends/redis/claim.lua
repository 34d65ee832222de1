-- claim: become the runner of one or more slots (Backend.claim), one after another, each on its
-- own job's keys as if it were a call of its own. Idempotent per token.
-- KEYS: the five keys of each claim's job (in _common.lua's order), claim after claim, and (not
--    on a cluster) the pauses hash last: the field is a job name or '*', the value the pause as
--    JSON with its rendered reason, read here so a stored pause holds every later claim.
-- ARGV: two arguments per claim (three when it publishes its notice), claim after claim:
--  1. A: job, slot_key, slot (absent for a manual run), lease_ms, overlap ('skip' or 'allow'),
--     skip_reason, skip_status and skip_cause (optional), pausable (true unless the trigger is
--     manual), restart_margin_ms, claims_channel (optional: where a won claim is announced; the
--     claims of a call of several are announced by the caller instead, in one message), and on
--     a Redis Cluster pauses (the stored pauses of the job and of '*', read just before).
--  2. The record's fields that the caller knows (job, slot_key, slot, attempt, run_id, token,
--     instance, trigger, requested_by) as a JSON object without its closing brace; the script
--     adds its own (id, status, started_at, fence, lease or reason and skip_cause) and closes it,
--     so a claim encodes no record (see _rows.claim_arguments).
--  3. (with claims_channel) the claim notice without its lease expiry and closing bracket.
-- Answers a JSON list of each claim's answer, in order: [now, fence] for a claim that recorded
-- attempt 1 running (the caller sent the rest of that record: its run and ticket are made from
-- the request, see _rows.claim_outcome), else {"now": ..., "run": the record} for a claim that
-- met a record or recorded a skip, or a refusal ({"refused": true, ...}).
-- Several claims in one call cost the client one command instead of one each (most of a batch
-- claim's client CPU was redis-py's per-command work). A call runs as one atomic step; one
-- that fails is sent again claim by claim by the caller, and a claim it had recorded then
-- answers as won again (same token). Memory: _common.lua's deny-OOM rule holds per call, so a
-- call writes at most its claims' records past maxmemory (_rows.CLAIMS_PER_CALL of them).
local PAUSES -- the pauses hash (KEYS' last), nil on a cluster
-- The arguments of the claim being decided: the first (decoded into A when needed), the second
-- and the third.
local DECIDE, KNOWN, NOTICE
A_LATER = true

-- The slot key that the claim's second argument opens with (see _rows.claim_arguments) when
-- the job and the key are plain JSON strings (no escapes), else nil: enough to find the slot's
-- record without decoding the first argument (a cjson.decode costs the server about 14 000
-- instructions, more than the two HGETs that find the record).
local function known_slot_key()
  return string.match(KNOWN, '^{"job":"[^"\\]*","slot_key":"([^"\\]*)"')
end

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
-- removed after this script's first (deny-OOM) write. A released attempt is scored by the time
-- of its release, so it is met only if the clock went back; it holds nothing, but stays: LEASES
-- is the index of open attempts (see open_runs.lua).
local function live_holder()
  local ids = redis.call('ZRANGEBYSCORE', LEASES, '(' .. int(NOW), '+inf')
  local best, stale = nil, {}
  for _, id in ipairs(ids) do
    local row = load(id)
    if not (row and row.status == 'running') then
      stale[#stale + 1] = id
    elseif not row.released and (not best or id < best.id) then
      best = row
    end
  end
  return best, stale
end

-- When this server started (ms, by its clock, a whole second; nil if INFO is refused), from
-- INFO's uptime, asked once per Lua state: a function library keeps the answer while the
-- server runs (a restart or a FUNCTION LOAD makes a new state), an EVAL script asks at each call
-- that needs it. INFO costs the server about 40 000 instructions, as much as the rest of a
-- claim that meets a record, and every job's first claim needs it (10 000 in a burst of 10 000
-- new jobs). A plain find, then the digits: a pattern search over the whole INFO text cost more
-- than the INFO call itself.
-- A refusal is not kept: it is the calling user's (ACL), and users share the library.
local STARTED_MS -- without the test-only clock offset
local function server_started_ms()
  local offset = A.clock_offset_ms or 0
  if not STARTED_MS then
    local info = redis.pcall('INFO', 'server')
    local at = type(info) == 'string' and string.find(info, 'uptime_in_seconds:', 1, true)
    local uptime = at and tonumber(string.match(info, '^%d+', at + 18))
    if not uptime then
      return nil
    end
    STARTED_MS = (math.floor((NOW - offset) / 1000) - uptime) * 1000
  end
  return STARTED_MS + offset
end

-- An answer for a slot this data set cannot vouch for; nothing is stored. cause: the
-- anarchon.SkipCause value ('pruned', 'unknown') the caller reads instead of the words.
local function refuse(reason, cause)
  local run = cjson.decode(KNOWN .. '}')
  run.token = ''
  run.status = 'skipped'
  run.fence = 0
  run.started_at = NOW
  run.reason = reason
  run.skip_cause = cause
  return reply({status = 'lost', refused = true, run = run})
end

-- The record of attempt 1 as stored: KNOWN and what this claim decided.
local function record(row)
  local out = KNOWN .. ',"id":"' .. row.id .. '","status":"' .. row.status
    .. '","started_at":' .. int(NOW) .. ',"fence":' .. int(row.fence)
  if row.reason then
    out = out .. ',"reason":' .. cjson.encode(row.reason) .. ',"finished_at":' .. int(NOW)
    if row.skip_cause then
      out = out .. ',"skip_cause":' .. cjson.encode(row.skip_cause)
    end
    return out .. '}'
  end
  return out .. ',"lease_expires_at":' .. int(row.lease_expires_at) .. '}'
end

-- The answer for the attempt stored as raw (JSON), sent as it is: the caller decides from it
-- (anarchon.kit.lease.answer_existing: skipped, won again by a retry of the same token, or
-- lost), so a claim that meets a record decodes and encodes nothing.
local function answer(raw)
  return '{"now":' .. int(NOW) .. ',"run":' .. raw .. '}'
end

-- The pause that holds this claim: the job's own, else the whole cluster's ('*'); active while
-- it has no end or NOW is before it (this server's clock).
local function active_pause()
  local held
  if PAUSES then
    held = redis.call('HMGET', PAUSES, A.job, '*')
  else
    held = {A.pauses and A.pauses[A.job], A.pauses and A.pauses['*']}
  end
  for i = 1, 2 do
    if held[i] then
      local pause = cjson.decode(held[i])
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

-- Decide the claim whose keys and arguments are set (META ..., A, KNOWN, NOTICE); its answer.
local function claim()
  local slot_key = A and A.slot_key or known_slot_key()
  if not slot_key then
    A = cjson.decode(DECIDE)
    slot_key = A.slot_key
  end
  local existing_id = redis.call('HGET', SLOTS, slot_key)
  if existing_id then
    local raw = redis.call('HGET', RUNS, existing_id)
    if raw then
      return answer(raw)
    end
  end
  A = A or cjson.decode(DECIDE)

  local meta = read_meta()
  if not (meta.seq or meta.fence or meta.last_slot or meta.pruned_through or meta.known_from) then
    -- The first record of this job in this data set. Slots from before this server started
    -- are unknown to it: after a restart without persistence they may have run already, so
    -- they are refused (fail closed) rather than run a second time. The margin covers the
    -- one-second resolution of the uptime and small clock skew between instances and Redis.
    -- known_from is written with the first attempt (insert), or alone if this claim is refused.
    local started = server_started_ms()
    if started then
      meta.known_from = started + A.restart_margin_ms
      meta.known_from_new = true
    end
  end

  if A.slot then
    if meta.pruned_through and A.slot <= meta.pruned_through then
      return refuse("too old: the job's history is pruned past this slot", 'pruned')
    end
    if meta.known_from and A.slot < meta.known_from then
      if meta.known_from_new then
        redis.call('HSET', META, 'known_from', int(meta.known_from))
      end
      return refuse('unknown: Redis holds no record of this job before ' .. iso(meta.known_from)
        .. ' (it restarted without its data), so the slot may have run already; not run again',
        'unknown')
    end
  end

  local reason = A.skip_reason
  local status = reason and (A.skip_status or 'skipped') or 'skipped'
  local cause = A.skip_cause -- an anarchon.SkipCause value, or nil
  if not reason and A.pausable then
    local pause = active_pause()
    if pause then
      reason, cause = paused_reason(pause), 'paused'
    end
  end
  local stale = {}
  if not reason and A.overlap == 'skip' then
    local holder
    holder, stale = live_holder()
    if holder then
      reason = 'overlap: run ' .. holder.run_id .. ' (' .. describe(holder)
        .. ') still holds its lease'
      cause = 'overlap'
    end
  end

  local row = {slot_key = A.slot_key, slot = A.slot, started_at = NOW}
  if reason then
    row.status = status
    row.fence = 0
    row.reason = reason
    row.skip_cause = cause
  else
    row.status = 'running'
    row.lease_expires_at = NOW + A.lease_ms
  end
  local raw = insert(row, meta, record)
  for _, id in ipairs(stale) do
    redis.call('ZREM', LEASES, id)
  end
  if not reason and A.claims_channel then
    -- A claim notice, so instances still waiting their rank delay do not claim. pcall: a user
    -- whose ACL refuses the channel still claims (the others then claim and lose).
    redis.pcall('PUBLISH', A.claims_channel, NOTICE .. int(row.lease_expires_at) .. ']')
  end
  if reason then
    return answer(raw)
  end
  -- Won: the caller knows the record but for its start (NOW, its lease from it) and fence.
  return '[' .. int(NOW) .. ',' .. int(row.fence) .. ']'
end

local function main()
  local count = math.floor(#KEYS / 5)
  PAUSES = #KEYS > 5 * count and KEYS[#KEYS] or nil
  local answers = {}
  local per = #ARGV / count
  for k = 1, count do
    local key, arg = 5 * (k - 1), per * (k - 1)
    META, RUNS, SLOTS, ORDER, LEASES = KEYS[key + 1], KEYS[key + 2], KEYS[key + 3],
      KEYS[key + 4], KEYS[key + 5]
    if k > 1 then
      A = nil
    end
    DECIDE, KNOWN, NOTICE = ARGV[arg + 1], ARGV[arg + 2], per > 2 and ARGV[arg + 3] or nil
    answers[k] = claim()
  end
  return '[' .. table.concat(answers, ',') .. ']'
end
