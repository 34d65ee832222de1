-- Prepended to history.lua and open_runs.lua (see _scripts.py): reading stored records by id.

-- Append to `out` the stored records (RUNS hash values) of the attempt ids `ids`, in their
-- order, passing over an id with none; in chunks of 500, as Lua's unpack is bounded.
local function append_records(out, runs, ids)
  for first = 1, #ids, 500 do
    local chunk = {}
    for i = first, math.min(first + 499, #ids) do
      chunk[#chunk + 1] = ids[i]
    end
    for _, raw in ipairs(redis.call('HMGET', runs, unpack(chunk))) do
      if raw then
        out[#out + 1] = raw
      end
    end
  end
end
