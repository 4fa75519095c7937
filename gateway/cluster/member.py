"""One replica's membership: a beat every `[cluster] publish_interval_s`, one script in one round trip,
that renews the replica's lease, publishes its endpoint load and reads the others', and runs the leader
election.

    P:members        zset {replica: lease expiry (Redis time)}
    P:load:REPLICA   string (JSON {endpoint: [in flight, prompt tokens, predicted output tokens]}), PX lease
    P:leader         string "REPLICA TOKEN", PX lease: the leader and its fencing token
    P:fence          counter: INCR at each election (the fencing token every agent command carries)
    P:cold           set of models whose cold start a follower asks the leader for
    P:fleet          counter: the leader bumps it when agent-started endpoints change (followers refresh)
    P:draining       set of endpoints the leader drains (followers stop placing there at once)
    P:coldfail       hash {model: "SEQ REASON"} and {"seq": SEQ}: the leader's last failed cold start of
                     each model (followers fail their requests waiting for it, as the leader does)

The leader renews its lease in its beat; it holds leadership, as far as this replica acts on it, until
`lease_s` after the send time of its last successful beat (Redis expires it no earlier), so a replica
that cannot reach Redis stops making fleet changes before another can be elected. A former leader's
commands already under way carry its old token: the node agents refuse them once they saw a newer one.

Redis down: the peers' load is dropped (placement uses the local view), no replica is leader (no fleet
changes), the shared limits fall back (gateway.cluster.limits). The first beat that answers recovers all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import orjson
import structlog

from gateway.cluster.limits import SharedLimits
from gateway.cluster.link import RedisLink, text
from gateway.config.cluster import ClusterSetup
from gateway.core.types import EndpointId
from gateway.sched.types import PeerLoad

log = structlog.get_logger("berth.cluster")

BEAT_LUA: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local me, lease_ms, p = ARGV[1], tonumber(ARGV[2]), ARGV[5]
local lease = lease_ms / 1000
local prev = redis.call('ZSCORE', KEYS[1], me)
local rejoined = 0
if (not prev) or tonumber(prev) < now then rejoined = 1 end
redis.call('ZADD', KEYS[1], now + lease, me)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60 * lease)
redis.call('SET', p .. ':load:' .. me, ARGV[3], 'PX', lease_ms)
local cur = redis.call('GET', KEYS[2])
if (not cur) and ARGV[4] == '1' then
  local tok = redis.call('INCR', KEYS[3])
  cur = me .. ' ' .. tok
  redis.call('SET', KEYS[2], cur, 'PX', lease_ms)
elseif cur and string.sub(cur, 1, #me + 1) == me .. ' ' then
  redis.call('PEXPIRE', KEYS[2], lease_ms)
end
local ndrain, nfail = tonumber(ARGV[7]), tonumber(ARGV[8])
local coldat = 9 + ndrain + 2 * nfail
for i = coldat, #ARGV do redis.call('SADD', KEYS[4], ARGV[i]) end
local cold = {}
if cur and string.sub(cur, 1, #me + 1) == me .. ' ' then
  for i = 9 + ndrain, coldat - 1, 2 do
    local seq = redis.call('HINCRBY', KEYS[7], 'seq', 1)
    redis.call('HSET', KEYS[7], ARGV[i], seq .. ' ' .. ARGV[i + 1])
  end
  cold = redis.call('SMEMBERS', KEYS[4])
  if #cold > 0 then redis.call('DEL', KEYS[4]) end
  if ARGV[6] == '1' then
    redis.call('INCR', KEYS[5])
    redis.call('DEL', KEYS[6])
    for i = 9, 8 + ndrain do redis.call('SADD', KEYS[6], ARGV[i]) end
  end
end
local fleet = redis.call('GET', KEYS[5]) or '0'
local draining = redis.call('SMEMBERS', KEYS[6])
local failed = redis.call('HGETALL', KEYS[7])
local out = {cur or '', rejoined, fleet, #cold, #draining, #failed}
for _, m in ipairs(cold) do out[#out + 1] = m end
for _, m in ipairs(draining) do out[#out + 1] = m end
for _, m in ipairs(failed) do out[#out + 1] = m end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')) do
  out[#out + 1] = m
  out[#out + 1] = redis.call('GET', p .. ':load:' .. m) or ''
end
return out
"""

LEAVE_LUA: Final = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', ARGV[2] .. ':load:' .. ARGV[1])
local cur = redis.call('GET', KEYS[2])
if cur and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then redis.call('DEL', KEYS[2]) end
return 1
"""

#: A leader acts on its lease for this share of lease_s after its last renewal was sent.
LEADER_SHARE: Final = 0.9


class Hooks:
    """What the member tells the rest of the replica (set by the composition root; defaults do nothing)."""

    def __init__(self) -> None:
        self.own_load: Callable[[], Mapping[EndpointId, PeerLoad]] = dict
        self.on_peers: Callable[[Mapping[EndpointId, PeerLoad]], None] = lambda loads: None
        self.on_leader: Callable[[bool], None] = lambda leader: None
        self.on_cold: Callable[[list[str]], None] = lambda models: None  # the leader: followers' cold starts
        # A follower: the leader changed the fleet (with the endpoints it drains now).
        self.on_fleet: Callable[[list[str]], None] = lambda draining: None
        # A follower: the leader's cold start of a model failed (model, the agent's reason).
        self.on_load_failed: Callable[[str, str], None] = lambda model, reason: None


class ClusterMember:
    def __init__(self, setup: ClusterSetup, link: RedisLink, *, limits: SharedLimits | None = None) -> None:
        c = setup.config
        self.setup = setup
        self.name = setup.name
        self.link = link
        self.limits = limits
        self.hooks = Hooks()
        self.lease_s = c.lease_s
        self.interval_s = c.publish_interval_s
        self._beat = link.script(BEAT_LUA)
        self._leave = link.script(LEAVE_LUA)
        self._keys = [
            link.key("members"),
            link.key("leader"),
            link.key("fence"),
            link.key("cold"),
            link.key("fleet"),
            link.key("draining"),
            link.key("coldfail"),
        ]
        self.members: tuple[str, ...] = ()
        self.leader: str | None = None
        self.token: int | None = None  # the fencing token of the leader seen last
        self._leader_until = 0.0  # monotonic: this replica acts as leader until then
        self._was_leader = False
        self.leader_changes = 0
        self.beats = 0
        self.last_beat_at: float | None = None  # monotonic
        self.peer_figures: dict[str, int] = {}  # replica -> endpoints it published
        self._cold: set[str] = set()
        self._fleet_bump = False
        self._draining: list[str] = []
        self._fleet_seen: str | None = None
        self._failed: dict[str, str] = {}  # the leader: failed cold starts to publish (model -> reason)
        self._failed_seen: dict[str, int] | None = None  # a follower: model -> the last failure acted on
        self.peer_loads: dict[EndpointId, PeerLoad] = {}
        self.want_leader = True
        self._stopped = False
        self._abandoned = False

    # ----------------------------------------------------------------- state
    @property
    def is_leader(self) -> bool:
        return self.leader == self.name and time.monotonic() < self._leader_until

    def fencing_token(self) -> int | None:
        """The token of this replica's leadership (None: not the leader now)."""
        return self.token if self.is_leader else None

    @property
    def fallback(self) -> bool:
        return not self.link.up

    def forward_cold(self, models: Iterable[str]) -> None:
        """A follower: ask the leader to cold-start these models (sent with the next beat)."""
        self._cold.update(models)

    def load_failed(self, model: str, reason: str) -> None:
        """The leader: a cold start of `model` failed (published with the next beat; followers fail
        the requests they hold for it)."""
        self._failed[model] = reason

    def fleet_changed(self, draining: Iterable[str]) -> None:
        """The leader: agent-started endpoints changed, `draining` the endpoints it drains now (sent with
        the next beat; followers refresh)."""
        self._fleet_bump = True
        self._draining = sorted(draining)

    def peer_inflight(self, eid: EndpointId) -> int:
        load = self.peer_loads.get(eid)
        return 0 if load is None else load.inflight

    # ----------------------------------------------------------------- the loop
    async def run(self) -> None:
        """Beat every interval until cancelled (then leave: the lease and the leadership go at once)."""
        try:
            while not self._stopped:
                await self.beat()
                await asyncio.sleep(self.interval_s)
        finally:
            if not self._abandoned:
                await self.leave()

    async def beat(self) -> bool:
        """One beat (see the module doc); False when Redis did not answer."""
        sent = time.monotonic()
        load = {
            eid: [v.inflight, v.prompt_tokens, round(v.output_tokens, 1)]
            for eid, v in self.hooks.own_load().items()
        }
        cold = sorted(self._cold)
        failed = dict(self._failed)
        bump = self._fleet_bump
        args: list[Any] = [
            self.name,
            int(self.lease_s * 1000),
            orjson.dumps(load),
            "1" if self.want_leader else "0",
            self.link.prefix,
            "1" if bump else "0",
            len(self._draining),
            len(failed),
            *self._draining,
            *(x for pair in failed.items() for x in pair),
            *cold,
        ]
        if self.limits is not None and self.beats % max(1, round(self.lease_s / self.interval_s)) == 0:
            # Once a lease: the true seat counts, so a seat lost to a failure (a release Redis never
            # took, an admission whose answer never came) is counted right within a lease.
            self.limits.reconcile_due = True
        got = await self.link.timed("beat", lambda r: self._beat(keys=self._keys, args=args, client=r))
        if got is None:
            self._lost()
            return False
        self.beats += 1
        self.last_beat_at = time.monotonic()
        self._cold.difference_update(cold)
        for model, reason in failed.items():
            if self._failed.get(model) == reason:
                del self._failed[model]
        if bump:
            self._fleet_bump = False
        self._read(got, sent)
        if self.limits is not None:
            if self.limits.reconcile_due:  # after the lease is renewed: a rejoined replica's seats count
                await self.limits.reconcile()
            self.limits.wake()
        return True

    def _read(self, got: list[Any], sent: float) -> None:
        cur = text(got[0])
        rejoined = int(got[1]) == 1
        fleet = text(got[2])
        ncold, ndrain, nfail = int(got[3]), int(got[4]), int(got[5])
        cold = [text(m) for m in got[6 : 6 + ncold]]
        draining = [text(m) for m in got[6 + ncold : 6 + ncold + ndrain]]
        at = 6 + ncold + ndrain
        failed = got[at : at + nfail]
        rest = got[at + nfail :]
        leader, _, token = cur.partition(" ")
        self.leader = leader or None
        self.token = int(token) if token else None
        if self.leader == self.name:
            self._leader_until = sent + self.lease_s * LEADER_SHARE
        members = []
        peers: dict[EndpointId, PeerLoad] = {}
        figures: dict[str, int] = {}
        for i in range(0, len(rest), 2):
            m = text(rest[i])
            members.append(m)
            if m == self.name or not rest[i + 1]:
                continue
            try:
                loads = orjson.loads(rest[i + 1])
            except orjson.JSONDecodeError:
                continue
            figures[m] = len(loads)
            for eid, (n, prompt, out) in loads.items():
                was = peers.get(EndpointId(eid))
                if was is None:
                    peers[EndpointId(eid)] = PeerLoad(int(n), int(prompt), float(out))
                else:
                    peers[EndpointId(eid)] = PeerLoad(
                        was.inflight + int(n), was.prompt_tokens + int(prompt), was.output_tokens + float(out)
                    )
        self.members = tuple(sorted(members))
        self.peer_figures = figures
        self.peer_loads = peers
        if self.limits is not None:
            self.limits.set_replicas(len(self.members), 0.0)
            if rejoined:
                self.limits.reconcile_due = True
        self.hooks.on_peers(peers)
        self._leadership()
        if cold and self.is_leader:
            self.hooks.on_cold(cold)
        if self._fleet_seen is not None and fleet != self._fleet_seen and not self.is_leader:
            self.hooks.on_fleet(draining)
        self._fleet_seen = fleet
        self._read_failed(failed)

    def _read_failed(self, pairs: list[Any]) -> None:
        """The leader's failed cold starts: a follower acts on each one new since its previous beat (those
        published before its first beat are history)."""
        first = self._failed_seen is None
        seen = self._failed_seen if self._failed_seen is not None else {}
        for i in range(0, len(pairs), 2):
            model = text(pairs[i])
            if model == "seq":
                continue
            n, _, reason = text(pairs[i + 1]).partition(" ")
            if seen.get(model, 0) >= int(n):
                continue
            seen[model] = int(n)
            if not first and not self.is_leader:
                self.hooks.on_load_failed(model, reason)
        self._failed_seen = seen

    def _lost(self) -> None:
        """Redis did not answer the beat: local view for placement, leadership only until it lapses."""
        self.peer_loads = {}
        self.hooks.on_peers({})
        self._leadership()

    def _leadership(self) -> None:
        now_leader = self.is_leader
        if now_leader != self._was_leader:
            self._was_leader = now_leader
            self.leader_changes += 1
            if now_leader:
                log.info("cluster_leader_elected", replica=self.name, fencing_token=self.token)
            else:
                log.warning("cluster_leader_lost", replica=self.name, leader=self.leader)
            self.hooks.on_leader(now_leader)

    async def check_leader(self) -> None:
        """Re-evaluate leadership as time passes (a lease that lapsed without a beat)."""
        self._leadership()

    async def leave(self) -> None:
        """Shutdown: give up the lease (and the leadership) at once rather than when it expires."""
        self._stopped = True
        keys = [self._keys[0], self._keys[1]]
        await self.link.call(
            "leave", lambda r: self._leave(keys=keys, args=[self.name, self.link.prefix], client=r)
        )
        if self._was_leader:
            self._was_leader = False
            self.hooks.on_leader(False)
        self._leader_until = 0.0

    def abandon(self) -> None:
        """Stop beating without leaving (what a killed replica does; tests)."""
        self._stopped = True
        self._abandoned = True

    def document(self) -> dict[str, Any]:
        """`berth cluster` and /admin/cluster."""
        return {
            "name": self.name,
            "redis": self.setup.safe_url,
            "redis_state": self.link.state.value,
            "redis_rtt_ms": None if self.link.rtt_s is None else round(self.link.rtt_s * 1000.0, 3),
            "redis_last_error": None if self.link.up else self.link.last_error,
            "members": list(self.members),
            "leader": self.leader,
            "is_leader": self.is_leader,
            "fencing_token": self.token,
            "lease_s": self.lease_s,
            "publish_interval_s": self.interval_s,
            "beats": self.beats,
            "since_last_beat_s": None
            if self.last_beat_at is None
            else round(time.monotonic() - self.last_beat_at, 3),
            "peer_endpoints": dict(sorted(self.peer_figures.items())),
            "fallback": {
                "limits": "local"
                if self.fallback and self.limits is not None and self.limits.on_down == "local"
                else "refuse"
                if self.fallback and self.limits is not None
                else "shared",
                "load": "local" if self.fallback else "shared",
                "leader": "none" if self.fallback else "elected",
            },
            "limits": None if self.limits is None else self.limits.document(),
        }
