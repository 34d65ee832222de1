-- renew: extend the lease of the attempt A holds (LeaseBackend.renew).
-- A: slot_key, token, fence, lease_ms.
local function main()
  local row, answer = held()
  if not row then
    return answer
  end
  if row.released then
    return reply({lost = 'released'})
  end
  row.lease_expires_at = NOW + A.lease_ms
  save(row)
  redis.call('ZADD', LEASES, int(row.lease_expires_at), row.id)
  return reply({expires = row.lease_expires_at})
end
