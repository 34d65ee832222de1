-- Prepended to every anarchon script when it is loaded (see _scripts.py). Each script is one
-- atomic step on ONE job: KEYS are that job's keys in the order of _keys.py (1 meta, 2 runs,
-- 3 slots, 4 order, 5 leases), all with the job's hash tag, so a script never crosses a Redis
-- Cluster slot (claim also takes the pauses hash last, except on a cluster, where it is given
-- the pauses in its arguments; and on one server, several jobs' claims in one call, each as
-- such a step: see claim.lua). ARGV[1] holds the call's arguments as a JSON object; every
-- script answers JSON.
-- Times are epoch milliseconds on this server's clock (TIME), never an instance's clock; a
-- test-only A.clock_offset_ms (never sent in production) moves it, so tests can pass time.
--
-- Memory: under maxmemory with noeviction, Redis refuses a script's first write if that write
-- is a deny-OOM command (HSET, ZADD) and, once a script has written, lets its later
-- writes through. So every script's first write is a deny-OOM one: while memory is full, every
-- change is refused alike (claims fail closed, no backup takes over, renewals and results
-- wait), and none grows memory past the limit.
--
-- Each script defines main(), its work; the call's state (KEYS, ARGV, the job's keys, A, NOW) is
-- set by begin() first (see _scripts.py: an EVAL script runs its whole text at every call, a
-- function library only main() and begin()).
local KEYS, ARGV, META, RUNS, SLOTS, ORDER, LEASES, A, NOW
-- Set by a script that decodes ARGV[1] itself when it needs it (claim.lua: a claim that meets a
-- record needs none of it).
local A_LATER

-- Integers as Redis arguments: exact, never in exponent notation.
local function int(x)
  return string.format('%d', x)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function begin(keys, argv)
  KEYS, ARGV = keys, argv
  META, RUNS, SLOTS, ORDER, LEASES = keys[1], keys[2], keys[3], keys[4], keys[5]
  if A_LATER and not string.find(argv[1], '"clock_offset_ms"', 1, true) then
    A = nil
    NOW = now_ms()
  else
    A = cjson.decode(argv[1])
    NOW = now_ms() + (A.clock_offset_ms or 0)
  end
end

local function reply(answer)
  answer.now = NOW
  return cjson.encode(answer)
end

-- The attempt stored under id (nil or false: none), or nil.
local function load(id)
  local raw = id and redis.call('HGET', RUNS, id)
  if not raw then
    return nil
  end
  return cjson.decode(raw)
end

-- The highest attempt of a slot key, or nil.
local function current(slot_key)
  return load(redis.call('HGET', SLOTS, slot_key))
end

local function save(row)
  redis.call('HSET', RUNS, row.id, cjson.encode(row))
end

-- The job's META fields that a new attempt reads (numbers, or nil), in one HMGET.
local function read_meta()
  local values = redis.call('HMGET', META, 'seq', 'fence', 'last_slot', 'pruned_through',
    'known_from')
  return {seq = tonumber(values[1]), fence = tonumber(values[2]), last_slot = tonumber(values[3]),
    pruned_through = tonumber(values[4]), known_from = tonumber(values[5])}
end

-- Store a new attempt, given META as read_meta() read it (with a known_from still to be
-- written, if any): all of META in one HSET (a claim's first write: deny-OOM). Ids are a
-- per-job sequence of fixed width, so attempts that start in the same millisecond keep their
-- insertion order in ORDER (ties sort by member). A running attempt gets a fence above every
-- earlier fence of the job and at least the server's clock in ms, so a Redis that lost its
-- data (restart without persistence, failover to a replica that missed the last writes) still
-- hands out fences above those it gave before, as long as its clock does not go back.
-- Returns the attempt as stored: encode(row) (JSON), cjson.encode by default.
local function insert(row, meta, encode)
  local seq = (meta.seq or 0) + 1
  row.id = string.format('%012d', seq)
  local fields = {'seq', int(seq)}
  if row.status == 'running' then
    row.fence = math.max((meta.fence or 0) + 1, NOW)
    fields[#fields + 1] = 'fence'
    fields[#fields + 1] = int(row.fence)
  end
  if row.slot and not (meta.last_slot and meta.last_slot >= row.slot) then
    fields[#fields + 1] = 'last_slot'
    fields[#fields + 1] = int(row.slot)
  end
  if meta.known_from_new then
    fields[#fields + 1] = 'known_from'
    fields[#fields + 1] = int(meta.known_from)
  end
  redis.call('HSET', META, unpack(fields))
  local raw = (encode or cjson.encode)(row)
  redis.call('HSET', RUNS, row.id, raw)
  redis.call('HSET', SLOTS, row.slot_key, row.id)
  redis.call('ZADD', ORDER, int(row.started_at), row.id)
  if row.status == 'running' then
    redis.call('ZADD', LEASES, int(row.lease_expires_at), row.id)
  end
  return raw
end

-- Drop a whole slot: every attempt (newest to oldest through each attempt's 'prev'), its
-- entry in SLOTS; returns the slot (nil for a manual run).
local function drop_slot(slot_key)
  local id = redis.call('HGET', SLOTS, slot_key)
  local slot = nil
  while id do
    local row = load(id)
    redis.call('HDEL', RUNS, id)
    redis.call('ZREM', ORDER, id)
    redis.call('ZREM', LEASES, id)
    if row and row.slot then
      slot = row.slot
    end
    id = row and row.prev or nil
  end
  redis.call('HDEL', SLOTS, slot_key)
  return slot
end

-- Renew, release and finish: the current attempt if A's token and fence still hold it, else
-- nil and the answer that makes the caller raise LeaseLost.
local function held()
  local row = current(A.slot_key)
  if row and row.token == A.token and row.fence == A.fence and row.status == 'running' then
    return row, nil
  end
  if not row then
    return nil, reply({lost = 'nobody'})
  end
  return nil, reply({lost = 'attempt', attempt = row.attempt, status = row.status})
end

-- Tell backups watching this run: released (take it over now) or finished (stop watching).
-- A lost message only delays them to the lease expiry.
local function notify(row, released)
  redis.call('PUBLISH', A.channel, cjson.encode({row.job, row.slot_key, released}))
end
