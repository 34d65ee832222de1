-- take_over: compare-and-set a new attempt onto a slot whose lease expired or was released
-- (LeaseBackend.take_over). One backup wins; the others see HELD (the new lease) or ENDED.
-- A: slot_key, run_id, token, instance, lease_ms, max_attempts, channel.
local function main()
  local row = current(A.slot_key)
  if not row or row.status ~= 'running' then
    return reply({status = 'ended', run = row})
  end
  if row.token == A.token and not row.released then
    -- A retried takeover whose first answer was lost: the caller holds the run already.
    return reply({status = 'taken', run = row, expires = row.lease_expires_at})
  end
  if not row.released and row.lease_expires_at and row.lease_expires_at > NOW then
    return reply({status = 'held', run = row, expires = row.lease_expires_at})
  end
  local why = row.released and 'handed over' or 'lease lost'
  row.status = 'failed'
  row.finished_at = NOW
  row.reason = why
  if row.attempt >= A.max_attempts then
    row.error = why .. ' on attempt ' .. int(row.attempt) .. ' of max_attempts='
      .. int(A.max_attempts) .. '; not retried'
    save(row) -- the first write: deny-OOM (see _common.lua)
    redis.call('ZREM', LEASES, row.id)
    notify(row, false)
    return reply({status = 'exhausted', run = row})
  end
  row.error = why .. ': attempt ' .. int(row.attempt + 1) .. ' taken over by ' .. A.instance
  save(row) -- the first write: deny-OOM (see _common.lua)
  redis.call('ZREM', LEASES, row.id)
  local new = {
    job = row.job, slot_key = row.slot_key, slot = row.slot, attempt = row.attempt + 1,
    run_id = A.run_id, token = A.token, instance = A.instance, trigger = row.trigger,
    requested_by = row.requested_by, status = 'running', started_at = NOW,
    lease_expires_at = NOW + A.lease_ms, prev = row.id,
  }
  insert(new, read_meta()) -- gives it the next fence
  return reply({status = 'taken', run = new, expires = new.lease_expires_at})
end
