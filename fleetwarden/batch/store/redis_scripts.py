"""Lua scripts of the Redis store: each runs atomically inside Redis, so each is one transaction.

Key layout (prefix P; an item's member is `<batch_id>:<idx, 8 digits>`)::

    P:batch:<id>      hash   the batch (static JSON + dynamic fields, tenant, queue, times)
    P:items:<id>      hash   idx -> canonical request line
    P:state:<id>      hash   idx -> Q (queued) | L:<token> (leased) | D (done)
    P:att:<id>        hash   idx -> dispatch attempts
    P:res:<id>        hash   idx -> stored result (o<line> | e<line> | x | c)
    P:q:<queue>       zset   queued members by deadline
    P:qa:<queue>      zset   queued members by creation time (promotion order)
    P:qb:<queue>      zset   the queue's running batches by creation time (promotion checks)
    P:lease:<queue>   zset   leased members by lease expiry
    P:open:<tenant>   int    unfinished items (quota)
    P:active          zset   validating / running batches by expires_at
    P:validating      zset   batches to validate, by seq
    P:finalize        set    batches whose files may be written

Keys are computed inside the scripts (not declared in KEYS), which rules out Redis Cluster;
standalone Redis with a replica and Sentinel is the supported HA setup.
"""

from __future__ import annotations

_COMMON = """
local P = ARGV[1]
local function split(m)
  return string.match(m, '^(.*):(%d+)$')
end
local function empty(v)
  return v == false or v == nil or v == ''
end
-- Queue a batch for finalisation once all its items are settled.
local function check_done(b, now)
  local bkey = P .. ':batch:' .. b
  local f = redis.call('HMGET', bkey, 'total', 'completed', 'failed', 'status', 'pending_final',
                      'queue')
  if tonumber(f[2]) + tonumber(f[3]) < tonumber(f[1]) then
    return
  end
  if not empty(f[6]) then
    redis.call('ZREM', P .. ':qb:' .. f[6], b)
  end
  if f[4] == 'in_progress' and empty(f[5]) then
    redis.call('HSET', bkey, 'status', 'finalizing', 'finalizing_at', now,
               'pending_final', 'completed')
    redis.call('ZREM', P .. ':active', b)
  end
  redis.call('SADD', P .. ':finalize', b)
end
"""

CREATE_BATCH = (
    _COMMON
    + """
-- ARGV: P, batch id, tenant, total, max open, expires_at, fields (JSON object of strings)
local id, tenant = ARGV[2], ARGV[3]
local total, maxopen = tonumber(ARGV[4]), tonumber(ARGV[5])
local openkey = P .. ':open:' .. tenant
local open = tonumber(redis.call('GET', openkey) or '0')
if open + total > maxopen then
  return {-1, open}
end
local seq = redis.call('INCR', P .. ':seq')
local bkey = P .. ':batch:' .. id
for k, v in pairs(cjson.decode(ARGV[7])) do
  redis.call('HSET', bkey, k, v)
end
redis.call('HSET', bkey, 'seq', seq)
redis.call('INCRBY', openkey, total)
redis.call('ZADD', P .. ':tbatches:' .. tenant, seq, id)
redis.call('ZADD', P .. ':validating', seq, id)
redis.call('ZADD', P .. ':active', ARGV[6], id)
return {seq, open}
"""
)

CLAIM = (
    _COMMON
    + """
-- ARGV: P, queue, by_deadline, promoted, limit, token, lease_until, then the promotion cut:
-- now, promote_after_s, reference_window_s (base.Promotion; ignored when promoted is 0)
local qk = ARGV[2]
local bydl, prom = tonumber(ARGV[3]), tonumber(ARGV[4])
local limit, token, lease_until = tonumber(ARGV[5]), ARGV[6], ARGV[7]
local now, after, ref = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local q, qa, lease = P .. ':q:' .. qk, P .. ':qa:' .. qk, P .. ':lease:' .. qk
local qb = P .. ':qb:' .. qk
local out = {}
local function take(m)
  local b, idx = split(m)
  redis.call('ZREM', q, m)
  redis.call('ZREM', qa, m)
  redis.call('ZADD', lease, lease_until, m)
  redis.call('HSET', P .. ':state:' .. b, idx, 'L:' .. token)
  local att = redis.call('HINCRBY', P .. ':att:' .. b, idx, 1)
  local req = redis.call('HGET', P .. ':items:' .. b, idx)
  local meta = redis.call('HMGET', P .. ':batch:' .. b, 'tenant', 'created_at', 'expires_at')
  out[#out + 1] = {m, att, req, meta[1], meta[2], meta[3]}
end
-- base.Promotion.promoted, the same expression in the same order (Lua numbers are doubles).
local function promoted(created, expires)
  local window, age = expires - created, after
  if window < ref then
    age = after * math.max(0, window) / ref
  end
  return now - created >= age
end
-- Up to k queued members of batch b, created at c, in line order. One score's members are
-- ordered by member, so b's are contiguous; a batch created at the very same instant is
-- paged past.
local function members_of(b, c, k)
  local found, offset, size, prefix = {}, 0, k, b .. ':'
  while true do
    local page = redis.call('ZRANGEBYSCORE', qa, c, c, 'LIMIT', offset, size)
    for _, m in ipairs(page) do
      if string.sub(m, 1, #prefix) == prefix then
        found[#found + 1] = m
        if #found == k then
          return found
        end
      elseif #found > 0 then
        return found
      end
    end
    if #page < size then
      return found
    end
    offset, size = offset + #page, 1000
  end
end
local k = math.min(prom, limit)
if k > 0 then
  -- Promotion is decided per running batch (few), oldest first, then its items are taken.
  for _, b in ipairs(redis.call('ZRANGE', qb, 0, -1)) do
    local f = redis.call('HMGET', P .. ':batch:' .. b, 'status', 'pending_final', 'created_at',
                         'expires_at')
    if f[1] ~= 'in_progress' or not empty(f[2]) then
      redis.call('ZREM', qb, b)
    elseif promoted(tonumber(f[3]), tonumber(f[4])) then
      for _, m in ipairs(members_of(b, f[3], k - #out)) do
        take(m)
      end
      if #out >= k then
        break
      end
    end
  end
  -- Every item older than promote_after_s is promoted whatever its window: this also finds a
  -- batch that an older version started without indexing it (a rolling upgrade).
  if #out < k then
    local old = redis.call('ZRANGEBYSCORE', qa, '-inf', now - after, 'LIMIT', 0, k - #out)
    for _, m in ipairs(old) do
      local t = redis.call('HMGET', P .. ':batch:' .. split(m), 'created_at', 'expires_at')
      if promoted(tonumber(t[1]), tonumber(t[2])) then
        take(m)
      end
    end
  end
end
k = math.min(bydl, limit - #out)
if k > 0 then
  for _, m in ipairs(redis.call('ZRANGE', q, 0, k - 1)) do
    take(m)
  end
end
return out
"""
)

INDEX_BATCHES = (
    _COMMON
    + """
-- ARGV: P. Puts every running batch in its queue's P:qb (idempotent): batches started before
-- the index existed. Returns how many were missing.
local added = 0
for _, b in ipairs(redis.call('ZRANGE', P .. ':active', 0, -1)) do
  local f = redis.call('HMGET', P .. ':batch:' .. b, 'status', 'pending_final', 'queue',
                       'created_at')
  if f[1] == 'in_progress' and empty(f[2]) and not empty(f[3]) then
    added = added + redis.call('ZADD', P .. ':qb:' .. f[3], f[4], b)
  end
end
return added
"""
)

SETTLE = (
    _COMMON
    + """
-- ARGV: P, now, then per settlement: member, token, kind (o|e|r), payload, tokens in, tokens
-- out, queue. Kind r (retry) keeps the lease until payload (the retry time); kind i (an
-- interrupted attempt) does the same and takes the attempt back.
local now = ARGV[2]
local applied = {}
local touched = {}
for i = 3, #ARGV, 7 do
  local m, token, kind, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local qk = ARGV[i + 6]
  local b, idx = split(m)
  local skey = P .. ':state:' .. b
  if redis.call('HGET', skey, idx) ~= 'L:' .. token then
    applied[#applied + 1] = 0
  elseif kind == 'r' or kind == 'i' then
    redis.call('ZADD', P .. ':lease:' .. qk, payload, m)
    if kind == 'i' and tonumber(redis.call('HGET', P .. ':att:' .. b, idx) or '0') > 0 then
      redis.call('HINCRBY', P .. ':att:' .. b, idx, -1)
    end
    applied[#applied + 1] = 1
  else
    local bkey = P .. ':batch:' .. b
    redis.call('HSET', skey, idx, 'D')
    redis.call('ZREM', P .. ':lease:' .. qk, m)
    redis.call('HSET', P .. ':res:' .. b, idx, kind .. payload)
    redis.call('HINCRBY', bkey, kind == 'o' and 'completed' or 'failed', 1)
    redis.call('HINCRBY', bkey, 'input_tokens', tonumber(ARGV[i + 4]))
    redis.call('HINCRBY', bkey, 'output_tokens', tonumber(ARGV[i + 5]))
    redis.call('DECR', P .. ':open:' .. redis.call('HGET', bkey, 'tenant'))
    touched[b] = true
    applied[#applied + 1] = 1
  end
end
for b, _ in pairs(touched) do
  check_done(b, now)
end
return applied
"""
)

_REQUEUE = """
-- Send member m of queue qk, leased (its lease entry already removed), back to the queue, or
-- settle it as cancelled if its batch is being cancelled.
local function requeue(m, qk, now)
  local b, idx = split(m)
  local bkey = P .. ':batch:' .. b
  local f = redis.call('HMGET', bkey, 'pending_final', 'expires_at', 'created_at', 'tenant')
  if f[1] == 'cancelled' then
    redis.call('HSET', P .. ':state:' .. b, idx, 'D')
    redis.call('HSET', P .. ':res:' .. b, idx, 'c')
    redis.call('HINCRBY', bkey, 'failed', 1)
    redis.call('DECR', P .. ':open:' .. f[4])
    check_done(b, now)
  else
    redis.call('HSET', P .. ':state:' .. b, idx, 'Q')
    redis.call('ZADD', P .. ':q:' .. qk, f[2], m)
    redis.call('ZADD', P .. ':qa:' .. qk, f[3], m)
  end
end
"""

RECOVER = (
    _COMMON
    + _REQUEUE
    + """
-- ARGV: P, queue, cutoff (lease expiry, or +inf), limit, now. Returns members handled.
local qk, cutoff, limit, now = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local lease = P .. ':lease:' .. qk
local members = redis.call('ZRANGEBYSCORE', lease, '-inf', cutoff, 'LIMIT', 0, limit)
for _, m in ipairs(members) do
  local b, idx = split(m)
  redis.call('ZREM', lease, m)
  local st = redis.call('HGET', P .. ':state:' .. b, idx)
  if st and string.sub(st, 1, 2) == 'L:' then
    requeue(m, qk, now)
  end
end
return #members
"""
)

REQUEUE = (
    _COMMON
    + _REQUEUE
    + """
-- ARGV: P, now, member, token, refund (1|0), queue. Returns 1 if the member was leased under
-- token (it is back in its queue now), else 0. A refund takes the attempt back from an
-- unfinished member either way.
local now, m, token, refund, qk = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local b, idx = split(m)
local st = redis.call('HGET', P .. ':state:' .. b, idx)
local att = P .. ':att:' .. b
if refund == '1' and st and st ~= 'D' and tonumber(redis.call('HGET', att, idx) or '0') > 0 then
  redis.call('HINCRBY', att, idx, -1)
end
if st ~= 'L:' .. token then
  return 0
end
redis.call('ZREM', P .. ':lease:' .. qk, m)
requeue(m, qk, now)
return 1
"""
)

_SETTLE_REST = """
-- Settle every unfinished item of batch b with `marker`; `only_queued` spares leased items.
local function settle_rest(b, qk, marker, only_queued)
  local skey = P .. ':state:' .. b
  local states = redis.call('HGETALL', skey)
  local n = 0
  for i = 1, #states, 2 do
    local idx, st = states[i], states[i + 1]
    if st == 'Q' or (st ~= 'D' and not only_queued) then
      local m = b .. ':' .. idx
      redis.call('ZREM', P .. ':q:' .. qk, m)
      redis.call('ZREM', P .. ':qa:' .. qk, m)
      redis.call('ZREM', P .. ':lease:' .. qk, m)
      redis.call('HSET', skey, idx, 'D')
      redis.call('HSET', P .. ':res:' .. b, idx, marker)
      n = n + 1
    end
  end
  return n
end
"""

EXPIRE = (
    _COMMON
    + _SETTLE_REST
    + """
-- ARGV: P, batch id, now. Returns 1 if the batch expired.
local b, now = ARGV[2], ARGV[3]
local bkey = P .. ':batch:' .. b
local f = redis.call('HMGET', bkey, 'status', 'pending_final', 'queue', 'tenant', 'total')
redis.call('ZREM', P .. ':active', b)
if not f[1] or not empty(f[2]) then
  return 0
end
if f[1] == 'validating' then
  redis.call('HSET', bkey, 'status', 'expired', 'expired_at', now)
  redis.call('ZREM', P .. ':validating', b)
  redis.call('DECRBY', P .. ':open:' .. f[4], tonumber(f[5]))
  return 1
end
if f[1] ~= 'in_progress' then
  return 0
end
local n = settle_rest(b, f[3], 'x', false)
redis.call('ZREM', P .. ':qb:' .. f[3], b)
redis.call('HINCRBY', bkey, 'failed', n)
redis.call('DECRBY', P .. ':open:' .. f[4], n)
redis.call('HSET', bkey, 'expired_at', now, 'pending_final', 'expired')
redis.call('SADD', P .. ':finalize', b)
return 1
"""
)

CANCEL = (
    _COMMON
    + _SETTLE_REST
    + """
-- ARGV: P, batch id, now. Returns 'ok', 'missing' or the blocking status as the client sees it,
-- followed by ' ' and the pending final status when there is one.
local b, now = ARGV[2], ARGV[3]
local bkey = P .. ':batch:' .. b
local f = redis.call('HMGET', bkey, 'status', 'pending_final', 'queue', 'tenant', 'total')
if not f[1] then
  return 'missing'
end
if f[1] == 'cancelling' or f[1] == 'cancelled' then
  return 'ok'
end
if f[1] == 'validating' then
  redis.call('HSET', bkey, 'status', 'cancelled', 'cancelling_at', now, 'cancelled_at', now)
  redis.call('ZREM', P .. ':validating', b)
  redis.call('ZREM', P .. ':active', b)
  redis.call('DECRBY', P .. ':open:' .. f[4], tonumber(f[5]))
  return 'ok'
end
if f[1] ~= 'in_progress' or not empty(f[2]) then
  if empty(f[2]) then
    return f[1]
  end
  return f[1] .. ' ' .. f[2]
end
local n = settle_rest(b, f[3], 'c', true)
redis.call('ZREM', P .. ':qb:' .. f[3], b)
redis.call('HINCRBY', bkey, 'failed', n)
redis.call('DECRBY', P .. ':open:' .. f[4], n)
redis.call('HSET', bkey, 'status', 'cancelling', 'cancelling_at', now,
           'pending_final', 'cancelled')
redis.call('ZREM', P .. ':active', b)
check_done(b, now)
return 'ok'
"""
)

SCRIPTS = {
    "CREATE_BATCH": CREATE_BATCH,
    "CLAIM": CLAIM,
    "SETTLE": SETTLE,
    "REQUEUE": REQUEUE,
    "RECOVER": RECOVER,
    "EXPIRE": EXPIRE,
    "CANCEL": CANCEL,
}
"""The scripts the store registers when it opens, by the name `RedisStore._run` calls them."""
