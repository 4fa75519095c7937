"""Lua pieces shared by the cluster's scripts (gateway.cluster.limits, gateway.cluster.slices)."""

from __future__ import annotations

from typing import Final

# A bucket's level refilled to `now` (no level yet: full).
LEVEL: Final = """
local function level(l, at, rate, cap, now)
  if not l then return cap end
  return math.min(cap, tonumber(l) + math.max(0, now - tonumber(at)) * rate)
end
"""

# The seats of a tenant's hash `f` (field -> value) held by live replicas; the seats of a replica whose
# lease (KEYS[1], the members' zset) ran out are dropped from `key` there and then. `alive` caches the
# leases looked up within one script run.
SEATS: Final = """
local alive = {}
local function seats(key, f, me, now)
  local total = 0
  for k, v in pairs(f) do
    if string.sub(k, 1, 2) == 's:' then
      local r, n = string.sub(k, 3), tonumber(v)
      if r ~= me then
        local live = alive[r]
        if live == nil then
          local exp = redis.call('ZSCORE', KEYS[1], r)
          live = exp ~= false and exp ~= nil and tonumber(exp) >= now
          alive[r] = live
        end
        if not live then
          redis.call('HDEL', key, k)
          n = 0
        end
      end
      total = total + math.max(0, n)
    end
  end
  return total
end
"""

# The Redis server's clock, in seconds (every replica's scripts judge time by the one clock).
NOW: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
"""

# The head of a script that decides on tenants' hashes (KEYS[1] the members' zset, KEYS[2..] the tenants;
# ARGV[1] this replica's name): `level`, `seats`, `now`, `me` and `out`, the reply it builds.
TENANT_SCRIPT_HEAD: Final = (
    LEVEL
    + SEATS
    + NOW
    + """
local me = ARGV[1]
local out = {}
"""
)
