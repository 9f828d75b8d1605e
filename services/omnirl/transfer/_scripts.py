"""Lua scripts the TransferQueue runs atomically on the Redis server (Redis >= 6.2)."""

from __future__ import annotations

# Move the staged trajectory and image (if any) under their keys, set the idempotency marker (if asked),
# INCR the count key (if asked) and append the stream entry, all or nothing. The payload bytes arrive
# beforehand by plain SETs under staged keys (`TransferQueue._append`, same pipeline) and are moved here
# with RENAME, which keeps their TTL and copies nothing: passed as ARGV, Lua copied and hashed every byte
# (6-10x the Redis CPU of a SET; docs/scale.md). When the marker already exists nothing is written (the
# staged keys are deleted) and the script returns nil -- unless the marker holds this call's own token
# (ARGV[8]): a client retry of a publish whose reply a dropped connection lost (a Redis restart) gets the
# entry id its first attempt appended, so the caller knows it did publish (the reward role's ledger missed
# such a score). The marker holds "token entry-id". A staged key that is gone (a Redis restarted without
# persistence between the SET and the script) is an error naming STAGED_MISSING; nothing is written.
# KEYS: stream, [tensor key if ARGV[2] == '1'], [its staged key if ARGV[3] == '1'],
#       [image key, its staged key if ARGV[4] == '1'], [done key if ARGV[5] == '1'], [count key if ARGV[7] == '1']
# ARGV: meta, has_key, has_staged_tensors, has_staged_image, has_done, done_ttl_ms, has_count, token
STAGED_MISSING = "OMNIRL_STAGED_MISSING"
PUBLISH = """
local n = 2
local tkey, tstaged, ikey, istaged, dkey, ckey
if ARGV[2] == '1' then tkey = KEYS[n]; n = n + 1 end
if ARGV[3] == '1' then tstaged = KEYS[n]; n = n + 1 end
if ARGV[4] == '1' then ikey = KEYS[n]; istaged = KEYS[n + 1]; n = n + 2 end
if ARGV[5] == '1' then dkey = KEYS[n]; n = n + 1 end
if ARGV[7] == '1' then ckey = KEYS[n] end
if (tstaged and redis.call('EXISTS', tstaged) == 0) or (istaged and redis.call('EXISTS', istaged) == 0) then
  return redis.error_reply('""" + STAGED_MISSING + """ a staged payload is gone')
end
if dkey and not redis.call('SET', dkey, ARGV[8], 'NX', 'PX', ARGV[6]) then
  if tstaged then redis.call('DEL', tstaged) end
  if istaged then redis.call('DEL', istaged) end
  local was = redis.call('GET', dkey)  -- only on a duplicate: the first publish reads nothing
  local sep = string.find(was, ' ', 1, true)
  if sep and string.sub(was, 1, sep - 1) == ARGV[8] then return string.sub(was, sep + 1) end
  return false
end
if ckey then redis.call('INCR', ckey) end
if istaged then redis.call('RENAME', istaged, ikey) end
local id
if tkey then
  if tstaged then redis.call('RENAME', tstaged, tkey) end
  id = redis.call('XADD', KEYS[1], '*', 'm', ARGV[1], 'k', tkey)
else
  id = redis.call('XADD', KEYS[1], '*', 'm', ARGV[1])
end
if dkey then redis.call('SET', dkey, ARGV[8] .. ' ' .. id, 'PX', ARGV[6]) end
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
