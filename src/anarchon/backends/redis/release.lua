-- release: hand the attempt A holds over to a backup (LeaseBackend.release); it stays
-- 'running' with its lease ended now, and the backups are woken.
-- A: slot_key, token, fence, channel.
local function main()
  local row, answer = held()
  if not row then
    return answer
  end
  row.released = true
  row.lease_expires_at = NOW
  save(row)
  redis.call('ZREM', LEASES, row.id)
  notify(row, true)
  return reply({})
end
