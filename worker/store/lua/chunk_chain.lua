-- Read what a takeover needs to continue an Action's chunk chain: the recorded head and the
-- chain key of every fence that had one (lua/chunk_record.lua, lua/lease_acquire.lua).
-- KEYS[1] lease hash
-- Returns {chunk_seq, chunk_sha256, chunk_stream_seq, fence1, key1, fence2, key2, ...}
-- (chunk_seq is -1 when no head was recorded).
local fields = redis.call('HGETALL', KEYS[1])
local seq, sha, stream_seq = '-1', '', '0'
local keys = {}
for i = 1, #fields, 2 do
  local name, value = fields[i], fields[i + 1]
  if name == 'chunk_seq' then seq = value
  elseif name == 'chunk_sha256' then sha = value
  elseif name == 'chunk_stream_seq' then stream_seq = value
  elseif string.sub(name, 1, 10) == 'chain_key.' then
    keys[#keys + 1] = string.sub(name, 11)
    keys[#keys + 1] = value
  end
end
local reply = {seq, sha, stream_seq}
for _, v in ipairs(keys) do reply[#reply + 1] = v end
return reply
