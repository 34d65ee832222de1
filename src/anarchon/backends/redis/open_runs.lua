-- open_runs: each job's attempts in its index of open ones (LEASES: every attempt still running,
-- scored by its lease's expiry, a released one by the time of its release) scored at or after
-- ARGV[1] (ms), as one JSON list of their stored records, in no order (LeaseBackend.open_runs).
-- KEYS: each job's LEASES and RUNS, job after job. Stands alone (no _common.lua); reads only.
-- Several jobs a call only on one server: on a cluster each job's keys lie in a slot of their
-- own, one job a call. A job with no open attempt costs one ZRANGEBYSCORE of an empty key, so
-- 10 000 jobs cost the server a few ms where their histories cost it (and the client) far more.
local out = {}
for i = 1, #KEYS, 2 do
  local ids = redis.call('ZRANGEBYSCORE', KEYS[i], ARGV[1], '+inf')
  for first = 1, #ids, 500 do -- Lua's unpack is bounded
    local chunk = {}
    for n = first, math.min(first + 499, #ids) do
      chunk[#chunk + 1] = ids[n]
    end
    for _, raw in ipairs(redis.call('HMGET', KEYS[i + 1], unpack(chunk))) do
      if raw then
        out[#out + 1] = raw
      end
    end
  end
end
return '[' .. table.concat(out, ',') .. ']'
