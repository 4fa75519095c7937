"""Tenant limits shared by the replicas: one Lua script per admission decision, releases sent in batches.

Keys (`P` is `[cluster] key_prefix`):

    P:tenant:TENANT  hash, one per tenant with limits:
                     rl, rt   requests_per_s bucket: level, and the Redis time it was computed at
                     tl, tt   tokens_per_min bucket (the level may be below zero: debt)
                     s:REPL   max_concurrency: the seats replica REPL holds
    P:members        zset {replica: lease expiry} (gateway.cluster.member)

(no bucket level yet: full.)

`admit` runs one script (the decisions asked for in the same turn of the event loop go together in one
script call, one round trip for all of them): it refills the tenant's buckets by Redis's own clock,
counts the seats of live replicas (a replica whose lease ran out has its seats dropped there and then:
a dead replica's seats return within one lease), and takes the request's charge and a seat only when
every limit lets it in: a tenant's buckets and seat in ONE round trip. Releases (the seat, and the
token charge corrected by what the engine reported, as in gateway.admission.limits) are queued and sent
by one background task, as many as are waiting in one script call; a replica also writes its true seat
counts (`reconcile`, from its beat) at start, after Redis came back and once per lease, so a release lost
to an outage does not leak a seat. The reconcile runs alone among the replica's seat changes
(gateway.cluster.seatorder), so the count it writes is exact.

While Redis does not answer, `[cluster] on_redis_down` decides: "local" admits through a local
`TenantLimiter` holding 1/replicas of each limit (replicas: the members seen last), "refuse" answers 503
limits_unavailable. A seat taken locally is given back locally.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

import structlog

from gateway.admission.limits import Limit, Refusal, Seat, TenantLimiter, TenantLimits, scaled
from gateway.cluster.link import RedisLink, text
from gateway.cluster.lua import LEVEL, NOW, TENANT_SCRIPT_HEAD
from gateway.cluster.seatorder import SeatOrder
from gateway.cluster.slices import Slices
from gateway.core import errors

log = structlog.get_logger("berth.cluster")

# KEYS: the members, then the tenant of each decision in turn (a tenant may come twice: decisions are
# taken in order, each on the state the one before left); ARGV: me, then per decision "rr rc tr tc cost
# maxc" (bucket rates and sizes, 0: no such limit). Returns per decision: code (0 admitted, 1 requests,
# 2 tokens, 3 concurrency), seconds until the bucket has room.
ADMIT_LUA: Final = (
    TENANT_SCRIPT_HEAD
    + """
local function decide(key, spec)
  local a = {}
  for x in string.gmatch(spec, '%S+') do a[#a + 1] = tonumber(x) end
  local rr, rc, tr, tc, cost, maxc = a[1], a[2], a[3], a[4], a[5], a[6]
  local h = redis.call('HGETALL', key)
  local f = {}
  for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
  if maxc > 0 then
    local total = seats(key, f, me, now)
    if total >= maxc then return 3, '0' end
  end
  local set = {}
  if rr > 0 then
    local rl = level(f['rl'], f['rt'], rr, rc, now)
    if rl < 1 then return 1, tostring((1 - rl) / rr) end
    set[#set + 1] = 'rl'; set[#set + 1] = tostring(rl - 1)
    set[#set + 1] = 'rt'; set[#set + 1] = tostring(now)
  end
  if tr > 0 then
    local tl = level(f['tl'], f['tt'], tr, tc, now)
    local need = math.min(cost, tc)
    if tl < need then return 2, tostring((need - tl) / tr) end
    set[#set + 1] = 'tl'; set[#set + 1] = tostring(tl - cost)
    set[#set + 1] = 'tt'; set[#set + 1] = tostring(now)
  end
  if #set > 0 then redis.call('HSET', key, unpack(set)) end
  if maxc > 0 then redis.call('HINCRBY', key, 's:' .. me, 1) end
  return 0, '0'
end
for i = 2, #KEYS do
  local code, wait = decide(KEYS[i], ARGV[i])
  out[#out + 1] = code
  out[#out + 1] = wait
end
return out
"""
)

# KEYS: the tenant of each release in turn; ARGV: me, then per release: seat (0/1), give, tpm rate, cap.
RELEASE_LUA: Final = (
    LEVEL
    + NOW
    + """
local seat = 's:' .. ARGV[1]
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 4
  if ARGV[a] == '1' then
    if redis.call('HINCRBY', KEYS[i], seat, -1) < 0 then redis.call('HSET', KEYS[i], seat, 0) end
  end
  local give, tr, tc = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if give ~= 0 and tr > 0 then
    local v = redis.call('HMGET', KEYS[i], 'tl', 'tt')
    local tl = math.min(tc, level(v[1], v[2], tr, tc, now) + give)
    redis.call('HSET', KEYS[i], 'tl', tostring(tl), 'tt', tostring(now))
  end
end
return #KEYS
"""
)

# KEYS: the tenants; ARGV: me, then the seats this replica holds in each.
SEATS_LUA: Final = """
for i = 1, #KEYS do redis.call('HSET', KEYS[i], 's:' .. ARGV[1], ARGV[i + 1]) end
return #KEYS
"""

_CODES: Final = {1: Limit.REQUESTS, 2: Limit.TOKENS, 3: Limit.CONCURRENCY}
#: At most this many releases in one script call.
RELEASE_BATCH: Final = 256
#: Releases kept while Redis does not answer; past it they are dropped (the next reconcile corrects seats).
MAX_PENDING: Final = 100_000


class SharedLimits:
    """gateway.admission.tenancy.SharedLimiter over Redis (see the module doc)."""

    def __init__(
        self,
        link: RedisLink,
        name: str,
        *,
        on_down: str,
        retry_after_s: float = 1.0,
        slice_share: float = 0.0,
    ) -> None:
        self.link = link
        self.name = name
        self.on_down = on_down
        self.retry_after_s = retry_after_s
        self._admit = link.script(ADMIT_LUA)
        self._release = link.script(RELEASE_LUA)
        self._seats = link.script(SEATS_LUA)
        self._members = link.key("members")
        self.limits: dict[str, TenantLimits] = {}
        self.fallback = TenantLimiter()  # 1/replicas of each limit, while Redis does not answer
        self.replicas = 1
        # tenant -> remote seats this replica holds (counted as the admission's answer arrives)
        self.held: dict[str, int] = {}
        self._pending: list[tuple[str, bool, float]] = []  # (tenant, seat, tokens to give back)
        # Decisions asked for in this turn of the loop, sent together: (tenant, spec, takes a seat, answer).
        self._batch: list[tuple[str, str, bool, asyncio.Future[tuple[int, str] | None]]] = []
        self.order = SeatOrder()  # the reconcile runs alone among this replica's seat changes
        self._sending: set[asyncio.Future[None]] = set()
        self.batches = 0  # admission script calls
        self.decisions = 0  # decisions sent in them
        self._wake = asyncio.Event()
        self.slices = Slices(link, name, share=slice_share, wake=self._wake.set, order=self.order)
        self.reconcile_due = True  # write the true seat counts on the next beat
        self.fallback_admits = 0
        self.refused_down = 0
        self.dropped_releases = 0

    # ----------------------------------------------------------------- configuration
    def configure(self, limits: Mapping[str, TenantLimits], now: float) -> None:
        self.limits = {name: lim for name, lim in limits.items() if lim.any}
        self.slices.configure(self.limits)
        self._configure_fallback(now)

    def set_replicas(self, n: int, now: float) -> None:
        """The number of live replicas (at least 1): the local fallback's share is 1/n."""
        n = max(1, n)
        if n != self.replicas:
            self.replicas = n
            self._configure_fallback(now)

    def _configure_fallback(self, now: float) -> None:
        share = 1.0 / self.replicas
        self.fallback.configure({t: scaled(lim, share) for t, lim in self.limits.items()}, now)

    # ----------------------------------------------------------------- the request path
    def admit_now(self, tenant: str, limits: TenantLimits, tokens: int) -> Seat | None:
        """A seat from this replica's slice of the tenant's limits; None: `admit` decides."""
        sl = self.slices.slices.get(tenant)
        return None if sl is None else self.slices.take(tenant, sl, tokens)

    async def admit(self, tenant: str, limits: TenantLimits, tokens: int, now: float) -> Seat | Refusal:
        """One decision, sent with every other decision asked for in the same turn of the event loop:
        one script call (one round trip) for all of them."""
        rps = limits.requests_per_s
        tpm = limits.tokens_per_min
        conc = limits.max_concurrency
        sl = self.slices.slices.get(tenant)
        if sl is not None:  # large limits: decided on this replica's slice of them
            taken = self.slices.take(tenant, sl, tokens) or await self.slices.admit(tenant, sl, tokens)
            return self._down(tenant, tokens, now) if taken is None else taken
        spec = " ".join(
            (
                "0" if rps is None else repr(float(rps)),
                "0" if rps is None else repr(max(1.0, float(rps))),
                "0" if tpm is None else repr(tpm / 60.0),
                "0" if tpm is None else str(max(1, tpm)),
                str(tokens),
                "0" if conc is None else str(conc),
            )
        )
        fut: asyncio.Future[tuple[int, str] | None] = asyncio.get_running_loop().create_future()
        self._batch.append((tenant, spec, conc is not None, fut))
        try:
            if len(self._batch) == 1:  # the first of this turn's decisions sends them all, shielded:
                # its own cancellation must not leave the others waiting
                send = asyncio.shield(self._send_batch())
                self._sending.add(send)
                send.add_done_callback(self._sending.discard)
                await send
            got = await fut
        except asyncio.CancelledError:
            # The request is gone; a seat Redis gave it meanwhile is given back (the answer's sender
            # gives back the seats of answers nobody waits for any more).
            fut.add_done_callback(lambda f: self._taken_for_nobody(f, tenant, conc is not None))
            raise
        if got is None:
            return self._down(tenant, tokens, now)
        code, wait = got
        if code:
            return Refusal(_CODES[code], None if code == 3 else float(wait))
        return Seat(tenant, tokens if tpm is not None else 0, None, remote=True)

    async def _send_batch(self) -> None:
        await asyncio.sleep(0)  # the other decisions of this turn join the batch
        async with self.order.change():  # those asked for while a reconcile ran join it too
            batch, self._batch = self._batch, []
            keys = [self._members, *(self._tenant_key(t) for t, _, _, _ in batch)]
            args = [self.name, *(spec for _, spec, _, _ in batch)]
            self.batches += 1
            self.decisions += len(batch)
            got = await self.link.call("admit", lambda r: self._admit(keys=keys, args=args, client=r))
            # Each seat is counted here, as its answer arrives (a reconcile may start once this block
            # ends, before the requests' own tasks resume).
            for i, (tenant, _, seat, fut) in enumerate(batch):
                answer = None if got is None else (int(got[2 * i]), text(got[2 * i + 1]))
                taken = seat and answer is not None and answer[0] == 0
                if taken:
                    self.held[tenant] = self.held.get(tenant, 0) + 1
                if not fut.done():
                    fut.set_result(answer)
                elif taken:  # its request was cancelled while it waited for the answer
                    self.release(Seat(tenant, 0, None, remote=True), None, 0.0)

    def _taken_for_nobody(self, fut: asyncio.Future[tuple[int, str] | None], tenant: str, seat: bool) -> None:
        if fut.cancelled() or fut.result() is None or fut.result()[0]:  # type: ignore[index]
            return
        if seat:
            self.release(Seat(tenant, 0, None, remote=True), None, 0.0)

    def _down(self, tenant: str, tokens: int, now: float) -> Seat | Refusal:
        if self.on_down == "refuse":
            self.refused_down += 1
            raise errors.limits_unavailable(self.retry_after_s)
        self.fallback_admits += 1
        return self.fallback.admit(tenant, tokens, now)

    def release(self, seat: Seat, used_tokens: int | None, now: float) -> None:
        if seat.released:
            return
        seat.released = True
        if self.slices.release(seat, used_tokens):
            return
        lim = self.limits.get(seat.tenant)
        holds = seat.tenant in self.held and self.held[seat.tenant] > 0
        if holds:
            self.held[seat.tenant] -= 1
        give = 0.0
        if used_tokens is not None and seat.charged_tokens:
            give = float(seat.charged_tokens - used_tokens)
        if not holds and (give == 0.0 or lim is None or lim.tokens_per_min is None):
            return
        if len(self._pending) >= MAX_PENDING:
            self.dropped_releases += 1
            self.reconcile_due = True
            return
        self._pending.append((seat.tenant, holds, give))
        self._wake.set()

    # ----------------------------------------------------------------- background
    async def flush_forever(self) -> None:
        """Send queued releases as they come, as many as wait in one script call."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            # Until the queue is empty or Redis is down (the member loop's beat wakes this again once
            # it is back).
            while await self.flush() and self._pending:
                pass

    async def flush(self) -> bool:
        """Send up to RELEASE_BATCH queued releases, then the slices' due top-ups and give-backs; False when
        Redis did not take them (they stay)."""
        if self._pending:
            async with self.order.change():  # the batch is taken after a reconcile that ran meanwhile
                batch = self._pending[:RELEASE_BATCH]
                keys: list[str] = []
                args: list[Any] = [self.name]
                for tenant, seat, give in batch:
                    lim = self.limits.get(tenant)
                    tpm = None if lim is None else lim.tokens_per_min
                    keys.append(self._tenant_key(tenant))
                    args += [
                        "1" if seat else "0",
                        give,
                        0 if tpm is None else tpm / 60.0,
                        0 if tpm is None else max(1, tpm),
                    ]
                if batch:
                    got = await self.link.call(
                        "release", lambda r: self._release(keys=keys, args=args, client=r)
                    )
                    if got is None:
                        return False
                    del self._pending[: len(batch)]
        return await self.slices.flush()  # outside the block: its calls take their own place in order

    @property
    def pending(self) -> int:
        return len(self._pending)

    def wake(self) -> None:
        """The member's beat: idle slices give back what they hold; queued releases are sent."""
        self.slices.beat()
        if self._pending:
            self._wake.set()

    def _tenant_key(self, tenant: str) -> str:
        return f"{self.link.prefix}:tenant:{tenant}"

    async def reconcile(self) -> bool:
        """Write the seats this replica holds for every tenant with max_concurrency (the member's beat
        calls it when `reconcile_due`), alone among its seat changes (gateway.cluster.seatorder); False
        when Redis did not answer (it is due again)."""
        async with self.order.alone():
            pairs = self.reconcile_pairs()
            if not pairs:
                return True
            keys = list(pairs)
            args: list[Any] = [self.name, *pairs.values()]
            if await self.link.call("seats", lambda r: self._seats(keys=keys, args=args, client=r)) is None:
                self.reconcile_due = True
                return False
        return True

    def reconcile_pairs(self) -> dict[str, int]:
        """tenant key -> the seats this replica holds, for every tenant with max_concurrency: exact when
        no seat change is under way (`reconcile` sees to it)."""
        self.reconcile_due = False
        out = {}
        for tenant, lim in self.limits.items():
            if lim.max_concurrency is None:
                continue
            n = self.held.get(tenant, 0) + self.slices.held_seats(tenant)
            out[self._tenant_key(tenant)] = n
        # Releases queued for seats now written as they are would count twice: they are seats no more.
        self._pending = [(t, False, give) for t, _, give in self._pending if give != 0.0]
        return out

    def document(self) -> dict[str, Any]:
        return {
            "on_redis_down": self.on_down,
            "replicas": self.replicas,
            "seats_held": {t: n for t, n in sorted(self.held.items()) if n},
            "pending_releases": len(self._pending),
            "fallback_admits": self.fallback_admits,
            "refused_while_down": self.refused_down,
            "dropped_releases": self.dropped_releases,
            "admission_calls": self.batches,
            "decisions": self.decisions,
            "held_back_by_reconcile": self.order.held_back,
            **self.slices.document(),
        }
