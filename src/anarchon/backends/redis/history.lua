-- history: up to A.limit attempts of the job, newest first (Backend.history), as their JSON.
-- O(log n + limit): a range of ORDER, then the records (append_records, _records.lua).
-- A: limit (>= 1).
local function main()
  local out = {}
  append_records(out, RUNS, redis.call('ZREVRANGE', ORDER, 0, A.limit - 1))
  return out
end
