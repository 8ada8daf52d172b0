//! The Lua scripts. Each primitive call runs exactly one of them, so each
//! is atomic on the server (Redis runs one script at a time).
//!
//! Record layout: one hash per key with field `v` (the version counter,
//! written only by `HINCRBY`, or set to the floor when the record is
//! created) and field `d` (the value; absent in a tombstone). The index is a
//! sorted set of the live keys, every score 0, so `ZRANGEBYLEX` orders
//! members by their bytes; a second sorted set holds the tombstones (so a
//! reclaim finds them without a scan), and a string holds the namespace's
//! floor (absent = 0): a key whose record does not exist starts at floor + 1.
//!
//! Every script reads and checks everything it touches *before* its first
//! write: a Redis script that fails halfway keeps the writes it already made,
//! so the only failures allowed after a write are impossible ones (a type was
//! checked, `HINCRBY` on a version that was checked to be a canonical decimal
//! below `i64::MAX`, the largest value `HINCRBY` can produce). Redis refuses a
//! script under OOM at its first write, which is therefore still "nothing
//! applied". A version field this crate could not have written (a sign,
//! leading zeros, letters, beyond `i64::MAX`) is reported as `malformed`.
//!
//! Replies start with a tag: `ok` / `applied` / `rejected` / `malformed`;
//! an `applied` txn's reply carries the versions its puts wrote.

/// Lua the scripts share: `valid_version(v)`, whether `v` is a version
/// this crate can have written (`HINCRBY` only makes canonical decimals, no
/// sign, no leading zero, up to `i64::MAX`; a string of 19 digits compares
/// like its number), and `read_record(key)`, a record hash's version field
/// and value, the version checked.
macro_rules! record_lua {
    () => {
        r#"
local function valid_version(v)
  if v == '0' then return true end
  if not string.match(v, '^[1-9]%d*$') then return false end
  return #v < 19 or (#v == 19 and v <= '9223372036854775807')
end
-- The version field and value of the record hash `key` (each nil when
-- absent): `true, v, d`, or `false, <malformed reply>`.
local function read_record(key)
  local r = redis.pcall('HMGET', key, 'v', 'd')
  if r['err'] then return false, {'malformed', key, r['err']} end
  local v = r[1]
  if v and not valid_version(v) then
    return false, {'malformed', key, 'version field is not a decimal integer in 0..2^63'}
  end
  return true, v, r[2]
end
"#
    };
}

/// Lua the txn scripts share: `plus_one(v)`, the decimal string one above
/// `v` (a canonical decimal below `i64::MAX`), exact where a Lua number (a
/// double) is not: the version a write gave a record, for the reply.
macro_rules! plus_one_lua {
    () => {
        r#"
local function plus_one(v)
  local head, nines = string.match(v, '^(.-)(9*)$')
  if head == '' then return '1' .. string.rep('0', #nines) end
  local last = string.byte(head, #head)
  return string.sub(head, 1, -2) .. string.char(last + 1) .. string.rep('0', #nines)
end
"#
    };
}

/// KEYS: the record keys. ARGV: none.
/// Reply: `ok`, then per key its visible version (a decimal string, `0` for
/// missing or tombstone) and its value (nil when missing), or
/// `malformed, <record key>, <reason>`.
pub(crate) const SNAPSHOT: &str = concat!(
    record_lua!(),
    r#"
local out = {'ok'}
for i = 1, #KEYS do
  local ok, v, d = read_record(KEYS[i])
  if not ok then return v end
  if d then
    if not v then
      return {'malformed', KEYS[i], 'value without a version field'}
    end
    out[#out + 1] = v
    out[#out + 1] = d
  else
    out[#out + 1] = '0'
    out[#out + 1] = false
  end
end
return out
"#
);

/// KEYS[1]: the index; KEYS[2..#KEYS-2]: the record keys of every distinct
/// key the txn names, asserted keys first (in assert order); KEYS[#KEYS-1]:
/// the tombstone set; KEYS[#KEYS]: the floor.
/// ARGV[1]: the byte length of the record-key prefix (to recover index members);
/// ARGV[2]: A, the number of asserted keys (KEYS[2..A+1]); ARGV[3..A+2]: their
/// expected versions (decimal, `0` = must not exist);
/// ARGV[A+3]: M, the number of mutations; then M triples
/// (KEYS position, `p` or `d`, value — empty for a delete);
/// then the publish command (`PUBLISH`, `SPUBLISH`, or empty for none) and
/// the change channel (the last two ARGV).
/// An applied txn that wrote something ends by publishing the written keys
/// (NUL-separated) on that channel, through `pcall`: a failed publish costs
/// a wake-up, never the txn. A rejected txn publishes nothing.
/// Reply: `applied`, then the version each put gave its record (decimal
/// strings, in mutation order, puts only); or `rejected` then version/value
/// pairs of the asserted keys (as in SNAPSHOT); or `malformed, <record key>,
/// <reason>`.
pub(crate) const TXN: &str = concat!(
    record_lua!(),
    plus_one_lua!(),
    r#"
local plen = tonumber(ARGV[1])
local nasserts = tonumber(ARGV[2])
local nmut = tonumber(ARGV[nasserts + 3])
local base = nasserts + 3
local dead = KEYS[#KEYS - 1]
local vis = {}
local val = {}
local raw = {}
for i = 2, #KEYS - 2 do
  local ok, v, d = read_record(KEYS[i])
  if not ok then return v end
  raw[i] = v
  if d then
    if not v then return {'malformed', KEYS[i], 'value without a version field'} end
    vis[i] = v
    val[i] = d
  else
    vis[i] = '0'
    val[i] = false
  end
end
for i = 1, nasserts do
  if vis[i + 1] ~= ARGV[i + 2] then
    local out = {'rejected'}
    for j = 1, nasserts do
      out[#out + 1] = vis[j + 1]
      out[#out + 1] = val[j + 1]
    end
    return out
  end
end
-- HINCRBY fails at i64::MAX: refuse before the first write, not halfway.
-- A put over a live record (a lock taken or released, a lease renewed)
-- touches only its own hash; a write that creates a record or changes its
-- liveness also needs the floor, the index and the tombstone set.
local shared = false
for m = 0, nmut - 1 do
  local pos = tonumber(ARGV[base + 1 + 3 * m])
  if raw[pos] == '9223372036854775807' then
    return {'malformed', KEYS[pos], 'version counter is exhausted (2^63 - 1)'}
  end
  if not raw[pos] or vis[pos] == '0' or ARGV[base + 2 + 3 * m] ~= 'p' then
    shared = true
  end
end
local floor = '0'
if shared then
  local types = {}
  for _, z in ipairs({KEYS[1], dead}) do
    local t = redis.call('TYPE', z)['ok']
    if t ~= 'zset' and t ~= 'none' then
      return {'malformed', z, 'index is a ' .. t .. ', not a sorted set'}
    end
    types[z] = t
  end
  local f = redis.pcall('GET', KEYS[#KEYS])
  if type(f) == 'table' and f['err'] then return {'malformed', KEYS[#KEYS], f['err']} end
  if f then
    if not valid_version(f) or f == '9223372036854775807' then
      return {'malformed', KEYS[#KEYS], 'floor is not a decimal integer in 0..2^63-1'}
    end
    floor = f
  end
  -- The floor and the tombstone set always exist once a namespace was
  -- written (the set keeps the member '', which no key can be): a Cluster
  -- slot being migrated answers TRYAGAIN to scripts naming a key it does
  -- not hold, and both move with the rest of the slot. A record that exists
  -- was written by a txn that made them, so the fast path above may skip
  -- this.
  if not f then redis.call('SET', KEYS[#KEYS], '0') end
  if types[dead] ~= 'zset' then redis.call('ZADD', dead, 0, '') end
end
local applied = {'applied'}
for m = 0, nmut - 1 do
  local pos = tonumber(ARGV[base + 1 + 3 * m])
  local k = KEYS[pos]
  local op = ARGV[base + 2 + 3 * m]
  local member = string.sub(k, plen + 1)
  -- No record (never written, or reclaimed): count on from the floor.
  if not raw[pos] then redis.call('HSET', k, 'v', floor) end
  redis.call('HINCRBY', k, 'v', 1)
  -- The index holds exactly the live keys, the tombstone set exactly the
  -- tombstones: touch them only when liveness changes.
  if op == 'p' then
    -- The version HINCRBY wrote: one above the record's, or the floor's
    -- for a record it created (checked below 2^63 - 1 above).
    applied[#applied + 1] = plus_one(raw[pos] or floor)
    redis.call('HSET', k, 'd', ARGV[base + 3 + 3 * m])
    if vis[pos] == '0' then
      redis.call('ZADD', KEYS[1], 0, member)
      if raw[pos] then redis.call('ZREM', dead, member) end
    end
  else
    redis.call('HDEL', k, 'd')
    if vis[pos] ~= '0' then redis.call('ZREM', KEYS[1], member) end
    redis.call('ZADD', dead, 0, member)
  end
end
local publish = ARGV[#ARGV - 1]
if nmut > 0 and publish ~= '' then
  local written = {}
  for m = 0, nmut - 1 do
    written[#written + 1] = string.sub(KEYS[tonumber(ARGV[base + 1 + 3 * m])], plen + 1)
  end
  redis.pcall(publish, ARGV[#ARGV], table.concat(written, '\0'))
end
return applied
"#
);

/// The hot case of [`TXN`] in a smaller script: one key asserted at a live
/// version (never 0) and overwritten by a put. Such a txn changes no
/// liveness, so it touches only its record hash, exactly like TXN's path
/// that skips the floor, the index and the tombstone set; fewer keys,
/// arguments and Lua steps make it about a third cheaper for the server.
/// KEYS[1]: the record key. ARGV[1]: the byte length of the record-key
/// prefix; ARGV[2]: the expected version; ARGV[3]: the value; ARGV[4],
/// ARGV[5]: the publish command (or empty) and the change channel.
/// Replies as TXN's (`applied` and the version written; a rejection carries
/// the one asserted key).
pub(crate) const TXN_PUT_LIVE: &str = concat!(
    record_lua!(),
    plus_one_lua!(),
    r#"
local ok, v, d = read_record(KEYS[1])
if not ok then return v end
if d and not v then return {'malformed', KEYS[1], 'value without a version field'} end
if not d then return {'rejected', '0', false} end
if v ~= ARGV[2] then return {'rejected', v, d} end
if v == '9223372036854775807' then
  return {'malformed', KEYS[1], 'version counter is exhausted (2^63 - 1)'}
end
redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'd', ARGV[3])
if ARGV[4] ~= '' then
  redis.pcall(ARGV[4], ARGV[5], string.sub(KEYS[1], tonumber(ARGV[1]) + 1))
end
return {'applied', plus_one(v)}
"#
);

/// KEYS[1]: the index. ARGV[1], ARGV[2]: the `ZRANGEBYLEX` bounds; ARGV[3]
/// (optional): the most members to return.
/// Reply: `ok`, then the members in byte order; or `malformed, <key>, <reason>`.
pub(crate) const KEYS: &str = r#"
local r
if ARGV[3] then
  r = redis.pcall('ZRANGEBYLEX', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
else
  r = redis.pcall('ZRANGEBYLEX', KEYS[1], ARGV[1], ARGV[2])
end
if r['err'] then return {'malformed', KEYS[1], r['err']} end
table.insert(r, 1, 'ok')
return r
"#;

/// Lua the announcement and the reclaim share: `clients_record(key)`, the
/// announcements hash (field `''`: the namespace's required format; every
/// other field a client id, value `<format>:<milliseconds>`), or a
/// `malformed` reply when the key is not a hash.
macro_rules! clients_lua {
    () => {
        r#"
local function clients_ok(key)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'hash' and t ~= 'none' then
    return false, {'malformed', key, 'announcements are a ' .. t .. ', not a hash'}
  end
  return true
end
"#
    };
}

/// KEYS[1]: the announcements hash; KEYS[2], KEYS[3], KEYS[4]: the index,
/// the tombstone set and the floor (whether the namespace was written).
/// ARGV[1]: the client id; ARGV[2]: its format; ARGV[3]: now (ms); ARGV[4]:
/// the oldest time still recent (ms).
/// The first announcement of a namespace writes its required format: the
/// client's when none of KEYS[2..4] exists, else `0` (records from before
/// announcements). Refuses (`newer, <required>`) when the namespace
/// requires a newer format; else upserts the client's field, removes
/// fields older than ARGV[4] and answers `ok, <required>`.
pub(crate) const ANNOUNCE: &str = concat!(
    clients_lua!(),
    r#"
local ok, err = clients_ok(KEYS[1])
if not ok then return err end
local required = redis.call('HGET', KEYS[1], '')
if not required then
  if redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4]) > 0 then
    required = '0'
  else
    required = ARGV[2]
  end
  redis.call('HSET', KEYS[1], '', required)
end
if tonumber(required) > tonumber(ARGV[2]) then return {'newer', required} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= '' then
    local at = tonumber(string.match(all[i + 1], ':(%d+)$'))
    if not at or at < tonumber(ARGV[4]) then redis.call('HDEL', KEYS[1], all[i]) end
  end
end
return {'ok', required}
"#
);

/// KEYS[1]: the tombstone set. ARGV[1]: how many members.
/// Reply: `ok`, then the first members (candidates of a reclaim; the first
/// is the set's placeholder `''`, which the caller drops).
pub(crate) const RECLAIM_CANDIDATES: &str = r#"
local r = redis.pcall('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if r['err'] then return {'malformed', KEYS[1], r['err']} end
table.insert(r, 1, 'ok')
return r
"#;

/// KEYS[1]: the tombstone set; KEYS[2]: the floor; KEYS[3]: the
/// announcements; KEYS[4..]: the record keys of candidates (read by
/// RECLAIM_CANDIDATES; anything may have happened to them since).
/// ARGV[1]: the byte length of the record-key prefix; ARGV[2]: the
/// reclaiming client's format; ARGV[3]: the oldest time still recent (ms);
/// ARGV[4]: `1` when the operator said older clients are stopped.
/// First, before any write, the announcements: refused (`refused,
/// <required>, <older format>, <its time>`, the last two empty when no
/// older client was seen) while a client of an older format announced
/// itself since ARGV[3], or the namespace requires another format than
/// ARGV[2] (older: unless ARGV[4] says `1`, which raises it).
/// Then deletes every candidate that is still a tombstone and raises the floor
/// to their highest version, in this one script, so no txn runs between.
/// Reply: `ok`, the number removed, `1` if tombstones are left else `0`;
/// or `malformed, <key>, <reason>`.
pub(crate) const RECLAIM: &str = concat!(
    record_lua!(),
    clients_lua!(),
    r#"
local plen = tonumber(ARGV[1])
local ours = tonumber(ARGV[2])
local ok, err = clients_ok(KEYS[3])
if not ok then return err end
local required = redis.call('HGET', KEYS[3], '') or '0'
local older, older_at = '', ''
local all = redis.call('HGETALL', KEYS[3])
for i = 1, #all, 2 do
  if all[i] ~= '' then
    local f, at = string.match(all[i + 1], '^(%d+):(%d+)$')
    if f and tonumber(f) < ours and tonumber(at) >= tonumber(ARGV[3])
       and (older_at == '' or tonumber(at) > tonumber(older_at)) then
      older, older_at = f, at
    end
  end
end
if older ~= '' or tonumber(required) > ours
   or (tonumber(required) < ours and ARGV[4] ~= '1') then
  return {'refused', required, older, older_at}
end
if tonumber(required) < ours then redis.call('HSET', KEYS[3], '', ARGV[2]) end
local floor = redis.pcall('GET', KEYS[2])
if type(floor) == 'table' and floor['err'] then return {'malformed', KEYS[2], floor['err']} end
if floor and not valid_version(floor) then
  return {'malformed', KEYS[2], 'floor is not a decimal integer in 0..2^63'}
end
local gone = {}
local stale = {}
local top = floor or '0'
for i = 4, #KEYS do
  local ok, v, d = read_record(KEYS[i])
  if not ok then return v end
  if v and not d then
    gone[#gone + 1] = KEYS[i]
    -- Canonical decimals: a longer one is larger; equal lengths compare as text.
    if #v > #top or (#v == #top and v > top) then top = v end
  else
    -- Re-created (or gone) since it was listed: only its set entry goes.
    stale[#stale + 1] = KEYS[i]
  end
end
for _, k in ipairs(gone) do
  redis.call('DEL', k)
  redis.call('ZREM', KEYS[1], string.sub(k, plen + 1))
end
for _, k in ipairs(stale) do
  redis.call('ZREM', KEYS[1], string.sub(k, plen + 1))
end
if #gone > 0 then redis.call('SET', KEYS[2], top) end
local left = 0
if redis.call('ZCARD', KEYS[1]) > 1 then
  left = 1
else
  -- Only the placeholder is left: a set that grew large keeps its large
  -- encoding after shrinking; written anew it takes its small one again.
  redis.call('DEL', KEYS[1])
  redis.call('ZADD', KEYS[1], 0, '')
end
return {'ok', #gone, left}
"#
);
