-- release: hand the attempt A holds over to a backup (LeaseBackend.release); it stays
-- 'running' with its lease ended now, and the backups are woken. It stays in LEASES too, scored
-- by now, which no overlap check reaches (they read the leases that end after now): LEASES
-- holds every open attempt, the index open_runs.lua reads.
-- A: slot_key, token, fence, channel.
local function main()
  local row, answer = held()
  if not row then
    return answer
  end
  row.released = true
  row.lease_expires_at = NOW
  save(row)
  redis.call('ZADD', LEASES, int(NOW), row.id)
  notify(row, true)
  return reply({})
end
