"""Lua scripts the TransferQueue runs atomically on the Redis server (Redis >= 6.2)."""

from __future__ import annotations

# Store the tensors and the image (if any), set the idempotency marker (if asked) and append the
# stream entry, and INCR the count key (if asked), all or nothing. When the marker already exists
# nothing is written and the script returns nil -- unless the marker holds this call's own token
# (ARGV[11]): a client retry of a publish whose reply a dropped connection lost (a Redis restart)
# gets the entry id its first attempt appended, so the caller knows it did publish (the reward
# role's ledger missed such a score). The marker holds "token entry-id". The image key gets the tensors' TTL.
# KEYS: stream, [tensor key if ARGV[2] == '1'], [image key if ARGV[8] == '1'], [done key if ARGV[6] == '1'],
#       [count key if ARGV[10] == '1']
# ARGV: meta, has_key, has_tensor_bytes, tensor_bytes, tensor_ttl_ms, has_done, done_ttl_ms,
#       has_image, image_bytes, has_count, token
PUBLISH = """
local n = 2
local tkey = nil
local ikey = nil
local dkey = nil
if ARGV[2] == '1' then tkey = KEYS[n]; n = n + 1 end
if ARGV[8] == '1' then ikey = KEYS[n]; n = n + 1 end
local ckey = nil
if ARGV[6] == '1' then dkey = KEYS[n]; n = n + 1 end
if ARGV[10] == '1' then ckey = KEYS[n] end
if dkey and not redis.call('SET', dkey, ARGV[11], 'NX', 'PX', ARGV[7]) then
  local was = redis.call('GET', dkey)  -- only on a duplicate: the first publish reads nothing
  local sep = string.find(was, ' ', 1, true)
  if sep and string.sub(was, 1, sep - 1) == ARGV[11] then return string.sub(was, sep + 1) end
  return false
end
if ckey then redis.call('INCR', ckey) end
if ikey then redis.call('SET', ikey, ARGV[9], 'PX', ARGV[5]) end
local id
if tkey then
  if ARGV[3] == '1' then redis.call('SET', tkey, ARGV[4], 'PX', ARGV[5]) end
  id = redis.call('XADD', KEYS[1], '*', 'm', ARGV[1], 'k', tkey)
else
  id = redis.call('XADD', KEYS[1], '*', 'm', ARGV[1])
end
if dkey then redis.call('SET', dkey, ARGV[11] .. ' ' .. id, 'PX', ARGV[7]) end
return id
"""

# Trim a stream to the entries some consumer group may still need:
#   per group, the first needed id is its oldest pending id, or (nothing pending) the id just
#   after its last-delivered-id; XTRIM MINID (exact) removes every entry below the minimum over
#   all groups. A stream without groups is left alone. Returns the number of entries removed.
# KEYS: stream
TRIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return 0 end
local best_ms, best_seq = nil, nil
for _, g in ipairs(groups) do
  local name, pending, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'pending' then pending = g[i + 1]
    elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  local id = last
  local bump = 1
  if pending > 0 then
    id = redis.call('XPENDING', KEYS[1], name)[2]
    bump = 0
  end
  local dash = string.find(id, '-', 1, true)
  local ms = tonumber(string.sub(id, 1, dash - 1))
  local seq = tonumber(string.sub(id, dash + 1)) + bump
  if best_ms == nil or ms < best_ms or (ms == best_ms and seq < best_seq) then
    best_ms, best_seq = ms, seq
  end
end
return redis.call('XTRIM', KEYS[1], 'MINID', string.format('%d-%d', best_ms, best_seq))
"""

# Renew a consumer's claim on entries it still holds: per id, only when the group's PEL has it under
# this consumer (XPENDING with the consumer filter), XCLAIM JUSTID resets its idle time (the delivery
# count stays). An entry another consumer reclaimed meanwhile is left with it -- a blind XCLAIM took it
# back, and both worked on it -- and one acknowledged meanwhile is not claimed again. Returns the ids renewed.
# KEYS: stream; ARGV: group, consumer, id...
TOUCH = """
local kept = {}
for i = 3, #ARGV do
  if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2]) > 0 then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    kept[#kept + 1] = ARGV[i]
  end
end
return kept
"""
