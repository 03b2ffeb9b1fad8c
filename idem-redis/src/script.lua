#!lua name=IDEM_LIBRARY
-- idem RedisStore: the store contract's rules (idem_runtime::store::rules) in Lua, loaded
-- once per server as a Redis Function library (FUNCTION LOAD, Redis >= 7) and called with
-- FCALL. The Rust side replaces IDEM_LIBRARY with `idem_` and a hash of this text, so two
-- idem versions on one server each call their own code. On a Redis without FUNCTION the
-- same text runs through EVALSHA, wrapped so that every call runs `main` (see mod.rs).
--
-- One record per key, a hash at KEYS[1]:
--   v    layout version ("1")          k     the idem key
--   fp   fingerprint (64 hex)          tool  tool name
--   st   state                         tok   claim token (32 hex)
--   lease  lease end (ms; running only) ca / ua  created / updated (ms)
--   pl   payload (JSON text; absent = none)   msg  message   dref  downstream ref
--   rx   "1" once the result expired   att   attempts (JSON array text)
--   op   the operation (JSON; absent = none)      rb    read-backs (JSON array text)
--
-- KEYS[2..7]: per-state sorted sets (score = created_at, member = key), in
-- RecordState::ALL order; KEYS[8]: running leases (score = lease end); KEYS[9]: terminal
-- records by their next retention step (score = updated_at + result window while the result
-- is kept, updated_at + tombstone window once it expired: `due_at`); KEYS[10]: the release
-- trace of KEYS[1]'s key, KEYS[11]: every kept release (only the releases with a trace use
-- them, and only their calls name them).
--
-- ARGV[1] now (ms, from the caller's clock, so tests can move time), ARGV[2] result
-- retention (ms), ARGV[3] tombstone retention (ms), ARGV[4] record key prefix, ARGV[5]
-- the operation, then the operation's arguments from ARGV[6].
--
-- A call that succeeds with nothing more to say returns the string 'ok' (a claim: 'claimed');
-- every other reply is an array whose first item says what it is.
--
-- Every check that can fail happens before the first write: Redis does not roll a script
-- back when it errors half-way.

-- One call's keys, arguments and what `main` reads from them. The library is built once
-- per server and these are set at the start of every call; Redis runs one call at a time,
-- so no two calls ever see each other's values.
local KEYS, ARGV, NOW, RESULTS, TOMBS, RPREFIX, OP, LEASES, EXPIRY, FULL
local IDX = { running = 2, completed = 3, failed = 4, pending = 5, unknown = 6, escalated = 7 }
-- The value's own timestamps decide expiry; the Redis TTL only reclaims memory, a minute
-- later, so clock skew between workers and Redis never drops a tombstone early.
local TTL_SLACK = 60000

-- True when s is text of exactly n hex digits: a claim token (32) or a fingerprint (64).
-- One anchored `%x+` and a length (the same test as a pattern of n `%x`, in half the work).
local function hex(s, n)
  return s and #s == n and string.find(s, '^%x+$') ~= nil
end

-- A whole number as decimal text. '%d' (an integer conversion) where the number fits, as
-- every time and count here does: '%.0f' prints the same digits, but through the C
-- library's floating-point formatting (some 6 000 instructions a number: a sixth of what a
-- fresh claim cost the server).
local function num(x)
  if x < 2 ^ 53 and x > -2 ^ 53 then
    return string.format('%d', x)
  end
  return string.format('%.0f', x)
end

-- This call's NOW as text, formatted once however often a call writes it.
local NOW_TEXT
local function now_text()
  if not NOW_TEXT then
    NOW_TEXT = num(NOW)
  end
  return NOW_TEXT
end

-- A stored time (milliseconds) as a number, or nil when it is not one. Lua's tonumber reads
-- 'nan', 'inf' and '1e999' as numbers; a score made of one is refused by ZADD halfway
-- through a script, so such a field must read as malformed before anything is written.
local function time_of(x)
  local n = tonumber(x)
  if n and n == n and n >= 0 and n < 2 ^ 53 and n == math.floor(n) then
    return n
  end
  return nil
end

local function corrupt(rk, detail)
  error({ err = 'IDEMCORRUPT ' .. rk .. ' ' .. detail })
end

-- A stored value as an error message may quote it: printable ASCII only, at most 64 bytes
-- (an error reply must be UTF-8 text, and a foreign value can be any bytes).
local function shown(v)
  local s = string.sub(tostring(v), 1, 64)
  return (string.gsub(s, '[^%w%p ]', '?'))
end

-- Timestamp's Display (RFC 3339, UTC, milliseconds), so messages match other backends.
local function rfc3339(ms)
  local secs = math.floor(ms / 1000)
  local msr = ms % 1000
  local days = math.floor(secs / 86400)
  local rem = secs % 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d,
    math.floor(rem / 3600), math.floor(rem / 60) % 60, rem % 60, msr)
end

local function terminal(st)
  return st == 'completed' or st == 'failed'
end

-- Drops a key whose record is gone from every index.
local function forget(k)
  for _, i in pairs(IDX) do
    redis.call('ZREM', KEYS[i], k)
  end
  redis.call('ZREM', LEASES, k)
  redis.call('ZREM', EXPIRY, k)
end

-- What the Rust side decodes, checked in full: a record whose evidence would not decode
-- is refused (IDEMCORRUPT) before any operation writes to it, as the other backends refuse
-- it, so a renew, settle or release can never act on (or free) a record nobody can read.
-- The names OutcomeClass and AttemptKind serialize to: keep them in step with the Rust
-- enums (a name missing here makes every record that uses it Corrupt on this backend).
local CLASSES = { rejected = true, unavailable = true, completed = true, failed = true,
  pending = true, unknown = true, escalated = true }
local KINDS = { returned = true, timed_out = true, panicked = true, late = true,
  abandoned = true }

local function whole(x, max)
  return type(x) == 'number' and x >= 0 and x == math.floor(x) and x <= max
end

local function absent(x)
  return x == nil or x == cjson.null
end

-- A store::AttemptRecord: numbers, times, class; kind and message optional.
local function attempt_ok(a)
  return whole(a.attempt, 4294967295) and whole(a.started_at, 2 ^ 64)
    and whole(a.finished_at, 2 ^ 64) and CLASSES[a.class] == true
    and (absent(a.kind) or KINDS[a.kind] == true)
    and (absent(a.message) or type(a.message) == 'string')
end

-- A store::ReadBackRecord: when, and what was found.
local function read_back_ok(rb)
  return whole(rb.at, 2 ^ 64) and type(rb.result) == 'string'
end

-- True when text is a JSON array whose every entry is an object entry_ok accepts.
local function evidence_ok(text, entry_ok)
  if type(text) ~= 'string' or string.sub(text, 1, 1) ~= '[' then
    return false
  end
  if text == '[]' then
    return true
  end
  local ok, list = pcall(cjson.decode, text)
  if not ok or type(list) ~= 'table' then
    return false
  end
  local n = 0
  for _ in pairs(list) do
    n = n + 1
  end
  if n ~= #list then
    return false
  end
  for _, e in ipairs(list) do
    if type(e) ~= 'table' or not entry_ok(e) then
      return false
    end
  end
  return true
end

-- The operations that write to a record a worker or a person holds (renew, settle,
-- release, reclaim, release_unsettled, release_traced), and `age` before time changes a
-- record, check its payload and operation too, so nothing acts on a record the Rust side
-- would report as corrupt. (`age` checks the other fields for every operation; these two can be large,
-- and a replay, which only reads them back, leaves their check to the Rust decode.)
local FULL_OPS = { renew = true, settle = true, release = true, reclaim = true,
  release_unsettled = true, release_traced = true }
-- The states a traced release may settle a record to before freeing it.
local RELEASABLE = { pending = true, unknown = true, escalated = true }

local function parses(rk, pl, op, tool)
  if not tool then
    corrupt(rk, 'missing tool')
  end
  if pl and not pcall(cjson.decode, pl) then
    corrupt(rk, 'malformed payload')
  end
  if op then
    local ok, o = pcall(cjson.decode, op)
    if not ok or type(o) ~= 'table' or type(o.scope) ~= 'table' then
      corrupt(rk, 'malformed operation')
    end
  end
end

-- The fields `age` reads; the operations that check a record in full read the three
-- `parses` checks in the same HMGET.
local AGE_FIELDS = { 'k', 'st', 'tok', 'fp', 'lease', 'ca', 'ua', 'rx', 'att', 'v', 'rb' }
local FULL_FIELDS = { 'k', 'st', 'tok', 'fp', 'lease', 'ca', 'ua', 'rx', 'att', 'v', 'rb',
  'pl', 'op', 'tool' }

-- Reads the record at rk with time applied (rules::age): an expired lease becomes unknown,
-- an expired result a tombstone, a lapsed tombstone nothing. Returns nil when absent.
local function age(rk)
  -- One HMGET, no TYPE first: it fails on a value that is not a hash (named by TYPE then),
  -- and finds no `k` and no `v` only in an absent key or a hash that is not a record
  -- (told apart by EXISTS then).
  local f = redis.pcall('HMGET', rk, unpack(FULL and FULL_FIELDS or AGE_FIELDS))
  if f.err then
    corrupt(rk, 'the value is a ' .. redis.call('TYPE', rk)['ok'] .. ', not a record hash')
  end
  if not f[1] and not f[10] and redis.call('EXISTS', rk) == 0 then
    return nil
  end
  local r = { k = f[1], st = f[2], tok = f[3], lease = time_of(f[5]), ca = time_of(f[6]),
    ua = time_of(f[7]), rx = f[8], att = f[9], rb = f[11] }
  if f[10] ~= '1' then
    corrupt(rk, 'unknown layout version ' .. shown(f[10]))
  end
  if not r.k or RPREFIX .. r.k ~= rk then
    corrupt(rk, 'its key field does not match its name')
  end
  if not r.st or not IDX[r.st] then
    corrupt(rk, 'unknown state ' .. shown(r.st))
  end
  if not hex(r.tok, 32) then
    corrupt(rk, 'malformed claim token')
  end
  if not hex(f[4], 64) then
    corrupt(rk, 'malformed fingerprint')
  end
  if not r.ca or not r.ua then
    corrupt(rk, 'missing or malformed times')
  end
  if not evidence_ok(f[9], attempt_ok) then
    corrupt(rk, 'malformed attempts')
  end
  if not evidence_ok(f[11], read_back_ok) then
    corrupt(rk, 'malformed read-backs')
  end
  if r.st == 'running' and not r.lease then
    corrupt(rk, 'a running record without a lease')
  end
  local ages = (r.st == 'running' and r.lease <= NOW)
    or (terminal(r.st) and (r.ua + TOMBS <= NOW or (r.rx ~= '1' and r.ua + RESULTS <= NOW)))
  if FULL then
    parses(rk, f[12], f[13], f[14])
  elseif ages then
    local p = redis.call('HMGET', rk, 'pl', 'op', 'tool')
    parses(rk, p[1], p[2], p[3])
  end

  if r.st == 'running' and r.lease <= NOW then
    redis.call('HSET', rk, 'st', 'unknown', 'ua', now_text(), 'msg', 'lease expired at '
      .. rfc3339(r.lease) .. ' with the handler unsettled; it may have committed')
    -- The lapsed lease stays in the record (rules::age): its holder may have sent until then.
    redis.call('ZREM', KEYS[IDX.running], r.k)
    redis.call('ZADD', KEYS[IDX.unknown], num(r.ca), r.k)
    redis.call('ZREM', LEASES, r.k)
    r.st, r.ua = 'unknown', NOW
  elseif terminal(r.st) then
    if r.ua + TOMBS <= NOW then
      redis.call('DEL', rk)
      redis.call('ZREM', KEYS[IDX[r.st]], r.k)
      redis.call('ZREM', EXPIRY, r.k)
      return nil
    elseif r.rx ~= '1' and r.ua + RESULTS <= NOW then
      -- rules::expire_result: the tombstone keeps no arguments, output, messages or
      -- read-backs; attempts keep their numbers, times, kinds and classes.
      redis.call('HSET', rk, 'rx', '1', 'rb', '[]')
      redis.call('HDEL', rk, 'pl', 'msg', 'op')
      -- Its next step is the tombstone's end.
      redis.call('ZADD', EXPIRY, num(r.ua + TOMBS), r.k)
      if f[9] ~= '[]' then
        local atts = cjson.decode(f[9])
        for _, a in ipairs(atts) do
          a.message = cjson.null
        end
        r.att = cjson.encode(atts)
        redis.call('HSET', rk, 'att', r.att)
      end
      r.rx, r.rb = '1', '[]'
    end
  end
  return r
end

-- A release's member in the KEYS[11] listing: 20 digits of time, '|', the key.
-- The record `rk` (aged) when it is a running claim held under `token`: what `renew` and
-- `release` may act on. Otherwise nil, and the reply saying why (stale, with the state found
-- or `absent`).
local function held_running(rk, token)
  local r = age(rk)
  if not r then
    return nil, { 'stale', 'absent' }
  end
  if r.st ~= 'running' or r.tok ~= token then
    return nil, { 'stale', r.st }
  end
  return r
end

-- The record `rk` (aged) when it is pending, unknown or escalated and held under `token`:
-- what `reclaim` and `release_unsettled` may act on. Otherwise nil, and the reply saying
-- why (absent, or stale with the state found).
local function held_unsettled(rk, token)
  local r = age(rk)
  if not r then
    return nil, { 'absent' }
  end
  local unsettled = r.st == 'pending' or r.st == 'unknown' or r.st == 'escalated'
  if not unsettled or r.tok ~= token then
    return nil, { 'stale', r.st }
  end
  return r
end

local function release_member(at, k)
  local digits = tostring(at)
  return string.rep('0', 20 - #digits) .. digits .. '|' .. k
end

local function move(r, to)
  if r.st ~= to then
    redis.call('ZREM', KEYS[IDX[r.st]], r.k)
    redis.call('ZADD', KEYS[IDX[to]], num(r.ca), r.k)
  end
end

-- When rules::age next changes a terminal record last updated at ua (`rx` its result_expired
-- field): the end of its result window while the result is kept, of its tombstone window
-- after. The EXPIRY index is scored by it, so a sweep finds both steps by one range.
local function due_at(ua, rx)
  if rx == '1' then
    return ua + TOMBS
  end
  return ua + RESULTS
end

-- Terminal records (just updated, `rx` their result_expired field) get the tombstone TTL
-- and their next retention step in EXPIRY; everything else must never expire.
local function retain(rk, k, st, rx)
  if terminal(st) then
    redis.call('PEXPIRE', rk, num(TOMBS + TTL_SLACK))
    redis.call('ZADD', EXPIRY, num(due_at(NOW, rx)), k)
  else
    redis.call('PERSIST', rk)
    redis.call('ZREM', EXPIRY, k)
  end
end

-- The JSON array `old` with the entries of `new` appended, as text (no JSON round trip,
-- so nothing in the evidence is reformatted); nil when `new` adds nothing.
local function joined(old, new)
  if new == '[]' then
    return nil
  end
  if not old or old == '[]' then
    return new
  end
  return string.sub(old, 1, -2) .. ',' .. string.sub(new, 2)
end

-- Appends a JSON array to the one stored in `field`.
local function append_to(rk, field, new)
  local v = joined(redis.call('HGET', rk, field), new)
  if v then
    redis.call('HSET', rk, field, v)
  end
end

-- rules::cap_evidence: keeps the first and last KEPT attempts and read-backs, and counts
-- what it drops in one marker read-back. KEPT is rules::EVIDENCE_KEPT.
local KEPT = 16
local MARKER = 'idem evidence cap: '
-- Every entry is at least 20 bytes of JSON, so arrays no longer than this cannot be over
-- the cap: the common settle decodes nothing.
local FITS = 2 * KEPT * 20 + 2

local function marker_counts(result)
  if type(result) ~= 'string' or string.sub(result, 1, #MARKER) ~= MARKER then
    return nil
  end
  local a, r = string.match(string.sub(result, #MARKER + 1), '^(%d+) attempts and (%d+) read%-backs')
  if not a then
    return nil
  end
  return tonumber(a), tonumber(r)
end

-- The first and last KEPT entries of list, and how many were dropped between them.
local function ends(list)
  local over = #list - 2 * KEPT
  if over <= 0 then
    return list, 0
  end
  local out = {}
  for i = 1, KEPT do
    out[#out + 1] = list[i]
  end
  for i = KEPT + over + 1, #list do
    out[#out + 1] = list[i]
  end
  return out, over
end

local function cap(rk)
  local att, rb = redis.call('HGET', rk, 'att'), redis.call('HGET', rk, 'rb')
  if #att <= FITS and #rb <= FITS then
    return
  end
  local atts, rbs = cjson.decode(att), cjson.decode(rb)
  local da, dr, at = 0, 0, NOW
  local marker
  for i, x in ipairs(rbs) do
    if marker_counts(x.result) then
      marker = i
      break
    end
  end
  if #atts <= 2 * KEPT and #rbs - (marker and 1 or 0) <= 2 * KEPT then
    return
  end
  if marker then
    local m = table.remove(rbs, marker)
    da, dr = marker_counts(m.result)
    at = m.at
  end
  local kept_atts, oa = ends(atts)
  local kept_rbs, orb = ends(rbs)
  da, dr = da + oa, dr + orb
  table.insert(kept_rbs, math.min(#kept_rbs, KEPT) + 1, { at = at,
    result = MARKER .. num(da) .. ' attempts and ' .. num(dr) .. ' read-backs dropped' })
  if oa > 0 then
    redis.call('HSET', rk, 'att', cjson.encode(kept_atts))
  end
  redis.call('HSET', rk, 'rb', cjson.encode(kept_rbs))
end

-- Appends a settlement's evidence: ARGV[11] attempts, ARGV[12] read-backs.
local function append(rk)
  append_to(rk, 'att', ARGV[11])
  append_to(rk, 'rb', ARGV[12])
  cap(rk)
end

-- Ages a few terminal records whose next retention step is due (a result to drop, a
-- tombstone to delete), so retention keeps up with the claims and the indexes do not keep
-- members of records that Redis already expired.
local function sweep()
  local due = redis.call('ZRANGEBYSCORE', EXPIRY, '-inf', now_text(), 'LIMIT', 0, 4)
  for _, k in ipairs(due) do
    local ok, r = pcall(age, RPREFIX .. k)
    if not ok then
      redis.call('ZREM', EXPIRY, k)
    elseif r == nil then
      forget(k)
    elseif not terminal(r.st) then
      redis.call('ZREM', EXPIRY, k)
    else
      redis.call('ZADD', EXPIRY, num(due_at(r.ua, r.rx)), k)
    end
  end
end

-- True when member a sorts before member b in a sorted set of equal scores: by bytes, as
-- Redis compares members. (Lua's `<` on strings follows the server's locale instead.)
local function member_lt(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- The rank in idx of the first member strictly after (score ca, member k), the set's own
-- order: a listing page then starts there. The cursor's member is usually still in the set
-- at that score (ZRANK); if it has left the state, the place it would have is found from
-- counts and a binary search over the members of equal score, which are in member order.
-- O(log n) either way, however deep into the set the cursor points.
local function rank_after(idx, ca, k)
  local score = redis.call('ZSCORE', idx, k)
  if score and tonumber(score) == ca then
    return redis.call('ZRANK', idx, k) + 1
  end
  local lo = redis.call('ZCOUNT', idx, '-inf', '(' .. num(ca))
  local hi = lo + redis.call('ZCOUNT', idx, num(ca), num(ca))
  -- Ranks below lo sort at or before the cursor; ranks from hi on sort after it.
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call('ZRANGE', idx, mid, mid)[1]
    if m and not member_lt(k, m) then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end

-- A replay's fast path (`all`, rk's hash as HGETALL returned it): true for a completed or
-- failed record of this layout, under its own name, that rules::age would leave as it is
-- (its result and tombstone windows both still run). A claim then returns it as read,
-- without `age`'s field checks: it writes nothing, and the Rust side decodes, so checks,
-- every field of what it returns. Anything else (unsettled, whose lease may have ended,
-- due to age, or not a record) takes the full path.
local function settled_and_current(rk, all)
  -- The five fields it needs, picked out as the pairs go by (no table of all fields).
  local v, k, st, ua, rx
  for i = 1, #all, 2 do
    local name = all[i]
    if name == 'v' then
      v = all[i + 1]
    elseif name == 'k' then
      k = all[i + 1]
    elseif name == 'st' then
      st = all[i + 1]
    elseif name == 'ua' then
      ua = all[i + 1]
    elseif name == 'rx' then
      rx = all[i + 1]
    end
  end
  if v ~= '1' or not k or RPREFIX .. k ~= rk or not terminal(st) then
    return false
  end
  ua = time_of(ua)
  return ua ~= nil and ua + TOMBS > NOW and (rx == '1' or ua + RESULTS > NOW)
end

-- The fields a settle's ARGV[8..10] set or clear, in that order.
local RESULT_FIELDS = { 'pl', 'msg', 'dref' }

-- rules::settle by the holder of ARGV[6] (the settle operation, and the first half of
-- release_traced). Returns the reply.
local function settle(rk)
  -- ARGV: 6 token, 7 state, 8 payload, 9 message, 10 downstream ref (opt), 11 attempts,
  -- 12 read-backs
  local new = ARGV[7]
  local r = age(rk)
  if not r then
    return { 'stale', 'absent' }
  end
  if r.tok ~= ARGV[6] then
    return { 'stale', r.st }
  end
  if r.st == 'running' then
    -- applied below
  elseif r.st == new and new ~= 'unknown' then
    -- A retried settle, or a handler that settled in its own transaction: keep the first
    -- result, add the evidence.
    append(rk)
    redis.call('HSET', rk, 'ua', now_text())
    retain(rk, r.k, r.st, r.rx)
    return 'ok'
  elseif r.st == 'unknown' then
    if new == 'unknown' or new == 'running' then
      append(rk)
      redis.call('HSET', rk, 'ua', now_text())
      return 'ok'
    end
  else
    return { 'stale', r.st }
  end
  if new == 'running' or not IDX[new] then
    return { 'invalid' }
  end
  -- One HSET and one HDEL: the state, the result ("+value" sets a field, "-" removes
  -- it; an absent downstream ref keeps the one stored), and the evidence appended to
  -- what `age` read.
  local set, del = { 'st', new, 'ua', now_text(), 'rx', '0' }, { 'lease' }
  for i = 1, 3 do
    local name, arg = RESULT_FIELDS[i], ARGV[7 + i]
    if string.sub(arg, 1, 1) == '+' then
      set[#set + 1] = name
      set[#set + 1] = string.sub(arg, 2)
    elseif name ~= 'dref' then
      del[#del + 1] = name
    end
  end
  local att, rb = joined(r.att, ARGV[11]), joined(r.rb, ARGV[12])
  if att then
    set[#set + 1] = 'att'
    set[#set + 1] = att
  end
  if rb then
    set[#set + 1] = 'rb'
    set[#set + 1] = rb
  end
  redis.call('HSET', rk, unpack(set))
  redis.call('HDEL', rk, unpack(del))
  if #(att or r.att) > FITS or #(rb or r.rb) > FITS then
    cap(rk)
  end
  move(r, new)
  redis.call('ZREM', LEASES, r.k)
  retain(rk, r.k, new, '0')
  return 'ok'
end

-- The release trace of KEYS[1]'s key (KEYS[10], a JSON array, oldest first, of { at, by,
-- note, record = the record hash as HGETALL returns it }), split as rules::keep_releases
-- does: the releases still kept, and the lapsed ones to drop from the listing.
local function kept_trace()
  local trace, gone = {}, {}
  local t = redis.call('TYPE', KEYS[10])['ok']
  if t ~= 'none' and t ~= 'string' then
    corrupt(KEYS[10], 'the release trace is a ' .. t .. ', not a string')
  end
  local old = t == 'string' and redis.call('GET', KEYS[10])
  if old then
    local ok, kept = pcall(cjson.decode, old)
    if not ok or type(kept) ~= 'table' then
      corrupt(KEYS[10], 'the release trace is not a JSON array')
    end
    for _, e in ipairs(kept) do
      if type(e) == 'table' and tonumber(e.at) and tonumber(e.at) + TOMBS > NOW then
        table.insert(trace, e)
      elseif type(e) == 'table' and tonumber(e.at) then
        table.insert(gone, e)
      end
    end
  end
  return trace, gone
end

-- Frees the unsettled record `r` at `rk` and adds it to its key's trace (`kept_trace`),
-- released by `who` with `note`; a trace keeps its last `kept` releases.
local function release_with_trace(rk, r, trace, gone, who, note, kept)
  table.insert(trace, { at = now_text(), by = who, note = note,
    record = redis.call('HGETALL', rk) })
  while #trace > tonumber(kept) do
    table.insert(gone, table.remove(trace, 1))
  end
  redis.call('DEL', rk)
  redis.call('ZREM', KEYS[IDX[r.st]], r.k)
  -- KEYS[11] lists every kept release for IdemStore::list_releases: all scores 0, so the
  -- members (the release time, zero-padded, then the key) sort in (time, key) order.
  for _, e in ipairs(gone) do
    redis.call('ZREM', KEYS[11], release_member(e.at, r.k))
  end
  redis.call('ZADD', KEYS[11], 0, release_member(now_text(), r.k))
  redis.call('ZREMRANGEBYLEX', KEYS[11], '-', '(' .. release_member(num(NOW - TOMBS + 1), ''))
  -- The trace outlives its newest release by the tombstone window (and the usual slack);
  -- older releases in it are dropped by their own time on every read and write.
  redis.call('SET', KEYS[10], cjson.encode(trace), 'PX', num(TOMBS + TTL_SLACK))
  return 'ok'
end

-- A hash's fields and values (as HGETALL lists them) as a table.
local function as_map(list)
  local m = {}
  for i = 1, #list, 2 do
    m[list[i]] = list[i + 1]
  end
  return m
end

-- True when two HGETALL lists hold the same fields with the same values, in any order.
local function same_hash(a, b)
  if #a ~= #b then
    return false
  end
  local m = as_map(a)
  for i = 1, #b, 2 do
    if m[b[i]] ~= b[i + 1] then
      return false
    end
  end
  return true
end

-- Writes at rk a record copied from another store (RedisStore::copy_into), with its index
-- entries, unchanged: its times, token and evidence stay as they were, so a repeat on this
-- store is answered as the old one would have answered it. ARGV from 6: the record's fields
-- and values, as HGETALL listed them there. A key holding the same record already counts as
-- copied (a copy that stopped half-way runs again); one holding anything else is a conflict,
-- and nothing is written. A running claim is never copied: its worker would settle it in
-- the old store.
local function import(rk)
  local fields = {}
  for i = 6, #ARGV do
    fields[#fields + 1] = ARGV[i]
  end
  local r = as_map(fields)
  local ca, ua = time_of(r.ca), time_of(r.ua)
  if r.v ~= '1' or not r.k or RPREFIX .. r.k ~= rk or not IDX[r.st] or r.st == 'running'
    or not ca or not ua then
    return { 'invalid' }
  end
  local t = redis.call('TYPE', rk)['ok']
  if t ~= 'none' then
    if t == 'hash' and same_hash(redis.call('HGETALL', rk), fields) then
      return 'ok'
    end
    return { 'conflict' }
  end
  if terminal(r.st) and ua + TOMBS <= NOW then
    return { 'lapsed' }
  end
  redis.call('HSET', rk, unpack(fields))
  redis.call('ZADD', KEYS[IDX[r.st]], num(ca), r.k)
  if terminal(r.st) then
    -- The tombstone ends when it would have ended in the old store (the new store's window).
    redis.call('PEXPIRE', rk, num(ua + TOMBS - NOW + TTL_SLACK))
    redis.call('ZADD', EXPIRY, num(due_at(ua, r.rx)), r.k)
  end
  return 'ok'
end

-- Writes a release trace copied from another store (KEYS[10], with its members of the
-- releases listing KEYS[11]). ARGV: 6 the trace (JSON text), 7 how long it has left to live
-- (ms), 8 on: its members of the listing. The same trace already there counts as copied;
-- another is a conflict, and nothing is written.
local function import_trace()
  local t = redis.call('TYPE', KEYS[10])['ok']
  if t ~= 'none' then
    if t == 'string' and redis.call('GET', KEYS[10]) == ARGV[6] then
      return 'ok'
    end
    return { 'conflict' }
  end
  local ok, trace = pcall(cjson.decode, ARGV[6])
  local ttl = time_of(ARGV[7])
  if not ok or type(trace) ~= 'table' or not ttl or ttl < 1 then
    return { 'invalid' }
  end
  redis.call('SET', KEYS[10], ARGV[6], 'PX', num(ttl))
  for i = 8, #ARGV do
    redis.call('ZADD', KEYS[11], 0, ARGV[i])
  end
  return 'ok'
end

-- One operation on the record at rk (KEYS[1]).
local function dispatch(rk)
  if OP == 'claim' then
    -- ARGV: 6 key, 7 fingerprint, 8 tool, 9 token, 10 lease (ms), 11 operation (opt)
    -- One HGETALL answers a replay. It is empty for an absent key (Redis keeps no empty
    -- hash) and an error for a value that is not a hash, which `age` then reports.
    local all = redis.pcall('HGETALL', rk)
    local hash = all.err == nil
    if hash and #all > 0 and settled_and_current(rk, all) then
      return { 'existing', all }
    end
    if (not hash or #all > 0) and age(rk) then
      return { 'existing', redis.call('HGETALL', rk) }
    end
    -- Only a new claim sweeps: every terminal record was once one, so the sweep keeps up,
    -- and a replay stays a read.
    sweep()
    local k = ARGV[6]
    local lease = num(NOW + tonumber(ARGV[10]))
    local fields = { 'v', '1', 'k', k, 'fp', ARGV[7], 'tool', ARGV[8], 'st', 'running',
      'tok', ARGV[9], 'lease', lease, 'ca', now_text(), 'ua', now_text(), 'rx', '0',
      'att', '[]', 'rb', '[]' }
    -- The key is free (absent, or its lapsed tombstone just deleted): nothing to remove.
    if string.sub(ARGV[11], 1, 1) == '+' then
      fields[#fields + 1] = 'op'
      fields[#fields + 1] = string.sub(ARGV[11], 2)
    end
    redis.call('HSET', rk, unpack(fields))
    redis.call('ZADD', KEYS[IDX.running], now_text(), k)
    redis.call('ZADD', LEASES, lease, k)
    return 'claimed'
  elseif OP == 'renew' then
    -- ARGV: 6 token, 7 lease (ms)
    local r, refusal = held_running(rk, ARGV[6])
    if not r then
      return refusal
    end
    local lease = num(NOW + tonumber(ARGV[7]))
    redis.call('HSET', rk, 'lease', lease, 'ua', now_text())
    redis.call('ZADD', LEASES, lease, r.k)
    return 'ok'
  elseif OP == 'settle' then
    return settle(rk)
  elseif OP == 'release' then
    -- ARGV: 6 token
    local r, refusal = held_running(rk, ARGV[6])
    if not r then
      return refusal
    end
    redis.call('DEL', rk)
    redis.call('ZREM', KEYS[IDX.running], r.k)
    redis.call('ZREM', LEASES, r.k)
    return 'ok'
  elseif OP == 'reclaim' then
    -- ARGV: 6 expected token, 7 fresh token, 8 lease (ms)
    local r, refusal = held_unsettled(rk, ARGV[6])
    if not r then
      return refusal
    end
    local lease = num(NOW + tonumber(ARGV[8]))
    redis.call('HSET', rk, 'st', 'running', 'tok', ARGV[7], 'lease', lease, 'ua', now_text())
    move(r, 'running')
    redis.call('ZADD', LEASES, lease, r.k)
    retain(rk, r.k, 'running', '0')
    return 'ok'
  elseif OP == 'release_unsettled' then
    -- ARGV: 6 expected token, 7 who, 8 note, 9 how many releases a trace keeps
    -- (rules::RELEASES_KEPT).
    local r, refusal = held_unsettled(rk, ARGV[6])
    if not r then
      return refusal
    end
    local trace, gone = kept_trace()
    return release_with_trace(rk, r, trace, gone, ARGV[7], ARGV[8], ARGV[9])
  elseif OP == 'release_traced' then
    -- ARGV: 6 to 12 as for settle, then 13 who, 14 note, 15 how many releases a trace
    -- keeps. One call, so nobody sees the record settled but not yet freed.
    if not RELEASABLE[ARGV[7]] then
      return { 'invalid' }
    end
    -- Read (and checked) before the settle writes: nothing can fail after it.
    local trace, gone = kept_trace()
    local settled = settle(rk)
    if settled ~= 'ok' then
      return settled
    end
    local r, refusal = held_unsettled(rk, ARGV[6])
    if not r then
      return refusal
    end
    return release_with_trace(rk, r, trace, gone, ARGV[13], ARGV[14], ARGV[15])
  elseif OP == 'import' then
    return import(rk)
  elseif OP == 'import_trace' then
    return import_trace()
  elseif OP == 'get' then
    local r = age(rk)
    if not r then
      return { 'absent' }
    end
    return { 'record', redis.call('HGETALL', rk) }
  elseif OP == 'age_leases' then
    -- KEYS[1] is unused; ARGV: 6 how many expired leases earlier pages found corrupt (they
    -- stay in the index and are skipped), 7 the page size. Ages at most one page of expired
    -- leases, so one call never holds Redis for long however many leases lapsed at once.
    -- Returns { 1 when a full page was aged (call again), the new skip count }.
    local offset, page = tonumber(ARGV[6]), tonumber(ARGV[7])
    local due = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now_text(), 'LIMIT', offset, page)
    for _, k in ipairs(due) do
      local ok, r = pcall(age, RPREFIX .. k)
      if not ok then
        offset = offset + 1
      elseif r == nil then
        forget(k)
      elseif r.st ~= 'running' then
        redis.call('ZREM', LEASES, k)
      else
        redis.call('ZADD', LEASES, num(r.lease), k)
      end
    end
    return { #due == page and 1 or 0, offset }
  elseif OP == 'sweep' then
    -- KEYS[1] is unused; ARGV: 6 the page size. Applies retention to at most one page of
    -- the terminal records whose next step is due (EXPIRY up to now): a result past its
    -- window becomes a tombstone, a lapsed tombstone is deleted. Every record it sees leaves
    -- the due range (re-scored to its next step, or removed), so the next page is new ones.
    -- Returns { 1 when a full page was seen (call again), results dropped, tombstones
    -- deleted, corrupt keys (dropped from the index; every read of them reports them) }.
    local page = tonumber(ARGV[6])
    local due = redis.call('ZRANGEBYSCORE', EXPIRY, '-inf', now_text(), 'LIMIT', 0, page)
    local dropped, deleted, bad = 0, 0, {}
    for _, k in ipairs(due) do
      local rk = RPREFIX .. k
      local before = redis.pcall('HGET', rk, 'rx')
      local existed = redis.call('EXISTS', rk) == 1
      local ok, r = pcall(age, rk)
      if not ok then
        redis.call('ZREM', EXPIRY, k)
        table.insert(bad, k)
      elseif r == nil then
        forget(k)
        if existed then
          deleted = deleted + 1
        end
      elseif not terminal(r.st) then
        redis.call('ZREM', EXPIRY, k)
      else
        if before ~= '1' and r.rx == '1' then
          dropped = dropped + 1
        end
        redis.call('ZADD', EXPIRY, num(due_at(r.ua, r.rx)), k)
      end
    end
    return { #due == page and 1 or 0, dropped, deleted, bad }
  elseif OP == 'list' then
    -- KEYS[1] is unused; ARGV: 6 state, 7 limit, then optionally the cursor to list strictly
    -- after: 8 its created_at (ms), 9 its key. Returns { records, corrupt keys }.
    -- The caller has aged expired leases first (`age_leases`), so list(unknown) includes
    -- them and list(running) does not.
    local state, limit = ARGV[6], tonumber(ARGV[7])
    local out, bad = {}, {}
    local idx = KEYS[IDX[state]]
    local offset = 0
    if ARGV[8] then
      offset = rank_after(idx, tonumber(ARGV[8]), ARGV[9])
    end
    while #out < limit do
      local batch = redis.call('ZRANGE', idx, offset, offset + 127)
      if #batch == 0 then
        break
      end
      for _, k in ipairs(batch) do
        if #out >= limit then
          break
        end
        local ok, r = pcall(age, RPREFIX .. k)
        if not ok then
          table.insert(bad, k)
          offset = offset + 1
        elseif r == nil then
          forget(k)
        elseif r.st ~= state then
          redis.call('ZREM', idx, k)
        else
          table.insert(out, redis.call('HGETALL', RPREFIX .. k))
          offset = offset + 1
        end
      end
    end
    return { out, bad }
  end
  return redis.error_reply('IDEMBADOP unknown operation ' .. tostring(OP))
end

-- A call: FCALL <library> numkeys KEYS... ARGV... (see the top of this file).
local function main(keys, argv)
  KEYS, ARGV = keys, argv
  NOW = tonumber(ARGV[1])
  NOW_TEXT = nil
  RESULTS = tonumber(ARGV[2])
  TOMBS = tonumber(ARGV[3])
  RPREFIX = ARGV[4]
  OP = ARGV[5]
  LEASES, EXPIRY = KEYS[8], KEYS[9]
  FULL = FULL_OPS[OP] == true
  return dispatch(KEYS[1])
end

redis.register_function('IDEM_LIBRARY', main)
