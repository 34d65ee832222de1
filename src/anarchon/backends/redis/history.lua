-- history: up to A.limit attempts of the job, newest first (Backend.history), as their JSON.
-- O(log n + limit): a range of ORDER, then the records in chunks (Lua's unpack is bounded).
-- A: limit (>= 1).
local function main()
  local ids = redis.call('ZREVRANGE', ORDER, 0, A.limit - 1)
  local out = {}
  for first = 1, #ids, 500 do
    local chunk = {}
    for i = first, math.min(first + 499, #ids) do
      chunk[#chunk + 1] = ids[i]
    end
    for _, raw in ipairs(redis.call('HMGET', RUNS, unpack(chunk))) do
      if raw then
        out[#out + 1] = raw
      end
    end
  end
  return out
end
