-- open_runs: each job's attempts in its index of open ones (LEASES: every attempt still running,
-- scored by its lease's expiry, a released one by the time of its release) scored at or after
-- ARGV[1] (ms), as one JSON list of their stored records, in no order (LeaseBackend.open_runs).
-- KEYS: each job's LEASES and RUNS, job after job; with ARGV[2] (a count n), each job's LEASES,
-- RUNS and ORDER, and its n newest attempts (by ORDER) come too, open or not, some maybe twice
-- (the first read since start: see RedisBackend.open_runs). Stands alone (no _common.lua; only
-- _records.lua before it); reads only. Several jobs a call only on one server: on a cluster
-- each job's keys lie in a slot of their own, one job a call. A job with no open attempt costs
-- one ZRANGEBYSCORE of an empty key, so 10 000 jobs cost the server a few ms where their
-- histories cost it (and the client) far more.
local out = {}
local newest = tonumber(ARGV[2])
local step = newest and 3 or 2
for i = 1, #KEYS, step do
  append_records(out, KEYS[i + 1], redis.call('ZRANGEBYSCORE', KEYS[i], ARGV[1], '+inf'))
  if newest then
    append_records(out, KEYS[i + 1], redis.call('ZREVRANGE', KEYS[i + 2], 0, newest - 1))
  end
end
return '[' .. table.concat(out, ',') .. ']'
