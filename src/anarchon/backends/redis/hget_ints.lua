-- hget_ints: HGET of one integer field (ARGV[1]) of each key (KEYS), in order, as one string:
-- the values joined by ',', an empty place where a key has none. Stands alone (no
-- _common.lua). Only on one server: on a cluster the keys lie in many slots. One string for
-- thousands of keys costs the client a fraction of what as many answers cost it (a scheduler
-- starting with 100 000 jobs reads every job's last_slot).
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HGET', key, ARGV[1]) or ''
end
return table.concat(out, ',')
