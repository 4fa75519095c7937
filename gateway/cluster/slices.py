"""Leased slices of a tenant's limits: admission without a Redis round trip for tenants whose limits are
large compared to one decision.

A replica takes a slice of each of a tenant's limits from Redis in one script call (`[cluster]
slice_share` of the limit: requests from the requests_per_s bucket, tokens from the tokens_per_min
bucket, seats counted as this replica's `s:REPL` seats, exactly as an exact decision takes them) and
spends it locally: a request is let in when the replica's slice holds a request, its token charge and a
free seat. A release gives the seat and the token correction back to the slice. One background call
tops a slice up when it runs below half and gives back what exceeds two slices; a tenant idle for one
beat gives back everything it holds spare. A request that finds its slice empty waits for one call
(shared by the tenant's requests waiting at that moment) and is refused with Redis's answer when the
bucket or the seats are exhausted; a refusal with a known wait is then answered locally until that wait
is over.

Consistency: a tenant never gets more than its limits (every request, token and seat spent was taken
from the shared state first; a bucket may burst by the slices held when they were taken, as a bucket
refill would); it may be refused while other replicas hold spare slices: at most two slices per other
replica, i.e. `2 × slice_share × (replicas - 1)` of a limit, for at most one beat after they go idle.
A tenant is sliced only when every one of its limits gives a slice of at least MIN_SLICE units; others
take the exact path (one script call per decision, gateway.cluster.limits). MIN_TOKEN_SLICE is the
tokens' minimum.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateway.admission.limits import Limit, Refusal, Seat, TenantLimits
from gateway.cluster.link import RedisLink, text
from gateway.cluster.lua import TENANT_SCRIPT_HEAD
from gateway.cluster.seatorder import SeatOrder

#: A limit whose slice would hold fewer units than this is decided exactly (one call per decision):
#: requests and seats, then tokens (a slice must hold several requests' charges, or every request would
#: need a call and every token correction would overflow the slice).
MIN_SLICE: Final = 2
MIN_TOKEN_SLICE: Final = 4096

# KEYS: the members, then one tenant per adjustment; ARGV: me, then per adjustment
# "rr rc tr tc maxc  wr wt need ws  gr gt gs": the buckets (rates, sizes; 0: no such limit) and the seat
# limit; the requests, tokens and seats wanted (`need`: tokens that must come at once for a waiting
# request, which may put the bucket in debt as an exact decision does); those given back. Returns per
# adjustment: requests, tokens and seats granted, then the seconds until the requests bucket, the tokens
# bucket has room (-1: not asked or granted) and 1 when no seat was free.
SLICE_LUA: Final = (
    TENANT_SCRIPT_HEAD
    + """
local function adjust(key, spec)
  local a = {}
  for x in string.gmatch(spec, '%S+') do a[#a + 1] = tonumber(x) end
  local rr, rc, tr, tc, maxc = a[1], a[2], a[3], a[4], a[5]
  local wr, wt, need, ws, gr, gt, gs = a[6], a[7], a[8], a[9], a[10], a[11], a[12]
  local h = redis.call('HGETALL', key)
  local f = {}
  for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
  local set = {}
  local r_got, t_got, s_got, r_wait, t_wait, full = 0, 0, 0, -1, -1, 0
  if rr > 0 and (wr > 0 or gr > 0) then
    local rl = math.min(rc, level(f['rl'], f['rt'], rr, rc, now) + gr)
    if wr > 0 then
      if rl >= 1 then
        r_got = math.min(math.floor(rl), wr)
        rl = rl - r_got
      else
        r_wait = (1 - rl) / rr
      end
    end
    set[#set + 1] = 'rl'; set[#set + 1] = tostring(rl)
    set[#set + 1] = 'rt'; set[#set + 1] = tostring(now)
  end
  if tr > 0 and (wt > 0 or need > 0 or gt > 0) then
    local tl = math.min(tc, level(f['tl'], f['tt'], tr, tc, now) + gt)
    if wt > 0 or need > 0 then
      if tl >= math.min(math.max(need, 1), tc) then
        t_got = math.max(math.min(tl, math.max(wt, need)), need)
        tl = tl - t_got
      else
        t_wait = (math.min(math.max(need, 1), tc) - tl) / tr
      end
    end
    set[#set + 1] = 'tl'; set[#set + 1] = tostring(tl)
    set[#set + 1] = 'tt'; set[#set + 1] = tostring(now)
  end
  if #set > 0 then redis.call('HSET', key, unpack(set)) end
  local seat = 's:' .. me
  if gs > 0 then
    local n = redis.call('HINCRBY', key, seat, -gs)
    if n < 0 then redis.call('HSET', key, seat, 0) end
    f[seat] = tostring(math.max(0, n))
  end
  if maxc > 0 and ws > 0 then
    local room = maxc - seats(key, f, me, now)
    if room >= 1 then
      s_got = math.min(room, ws)
      redis.call('HINCRBY', key, seat, s_got)
    else
      full = 1
    end
  end
  out[#out + 1] = r_got
  out[#out + 1] = tostring(t_got)
  out[#out + 1] = s_got
  out[#out + 1] = tostring(r_wait)
  out[#out + 1] = tostring(t_wait)
  out[#out + 1] = full
end
for i = 2, #KEYS do adjust(KEYS[i], ARGV[i]) end
return out
"""
)


@dataclass(slots=True)
class Slice:
    """What one replica holds of one tenant's limits."""

    spec: str  # the script's "rr rc tr tc maxc"
    sr: int  # slice sizes: requests, tokens, seats (0: the tenant has no such limit)
    st: int
    ss: int
    req: int = 0  # requests held
    tok: float = 0.0  # tokens held
    seats: int = 0  # seats taken in Redis (this replica's s:REPL share of them), in use or spare
    used: int = 0  # requests admitted from the slice and not released
    asking: int = 0  # seats asked for in calls not answered yet
    giving: int = 0  # seats given back in calls not answered yet
    busy: bool = False  # a request was admitted since the last beat
    refused: Refusal | None = None  # Redis's last refusal, answered locally until `refused_until`
    refused_until: float = 0.0  # monotonic
    call: asyncio.Future[bool] | None = None  # a waiting request's adjustment under way

    def low(self) -> bool:
        return (
            (self.sr > 0 and self.req * 2 < self.sr)
            or (self.st > 0 and self.tok * 2 < self.st)
            or (self.ss > 0 and (self.seats - self.used) * 2 < self.ss)
        )

    def high(self) -> bool:
        return (
            self.req > 2 * self.sr
            or (self.st > 0 and self.tok > 2 * self.st)
            or (self.ss > 0 and self.seats - self.used > 2 * self.ss)
        )


def slice_of(limits: TenantLimits, share: float) -> Slice | None:
    """The tenant's slice sizes (`share` of each limit), or None when one of them would be below
    MIN_SLICE (that tenant is decided exactly)."""
    rps, tpm, conc = limits.requests_per_s, limits.tokens_per_min, limits.max_concurrency
    if share <= 0 or not limits.any:
        return None
    rc = 0.0 if rps is None else max(1.0, float(rps))
    tc = 0 if tpm is None else max(1, tpm)
    has = (rps is not None, tpm is not None, conc is not None)
    sizes = [math.floor(limit * share) if h else 0 for h, limit in zip(has, (rc, tc, conc or 0), strict=True)]
    mins = (MIN_SLICE, MIN_TOKEN_SLICE, MIN_SLICE)
    if any(h and size < m for h, size, m in zip(has, sizes, mins, strict=True)):
        return None
    spec = " ".join(
        (
            "0" if rps is None else repr(float(rps)),
            repr(rc),
            "0" if tpm is None else repr(tpm / 60.0),
            str(tc),
            "0" if conc is None else str(conc),
        )
    )
    return Slice(spec, sizes[0], sizes[1], sizes[2])


class Slices:
    """The slices this replica holds, per sliced tenant (see the module doc)."""

    def __init__(
        self,
        link: RedisLink,
        name: str,
        *,
        share: float,
        wake: Callable[[], None],
        order: SeatOrder | None = None,
    ) -> None:
        self.link = link
        self._order = order or SeatOrder()  # the replica's seat changes against its reconcile
        self.name = name
        self.share = share
        self._script = link.script(SLICE_LUA)
        self._members = link.key("members")
        self._wake = wake
        self.slices: dict[str, Slice] = {}
        self.retired: dict[str, Slice] = {}  # tenants no longer sliced that still hold something
        self._due: set[str] = set()  # tenants whose slice wants a top-up or a give-back
        self._idle: set[str] = set()  # ... of which idle ones: give back everything spare
        self._sending: set[asyncio.Future[None]] = set()
        self.calls = 0  # adjustment script calls
        self.local = 0  # admissions decided on a slice

    def configure(self, limits: Mapping[str, TenantLimits]) -> None:
        """A (re)load: a tenant whose limits changed keeps what it holds (given back when it is idle or
        above two new slices); a tenant no longer sliced gives back all it holds at its next beat."""
        new: dict[str, Slice] = {}
        for tenant, lim in limits.items():
            fresh = slice_of(lim, self.share)
            old = self.slices.get(tenant) or self.retired.pop(tenant, None)
            if fresh is not None and old is not None:
                old.spec, old.sr, old.st, old.ss = fresh.spec, fresh.sr, fresh.st, fresh.ss
                fresh = old
            if fresh is not None:
                new[tenant] = fresh
        for tenant, old in self.slices.items():
            if tenant not in new and (old.used or old.seats or old.req or old.tok):
                old.sr = old.st = old.ss = 0  # holds on to nothing new; gives back what it has
                self.retired[tenant] = old
        self.slices = new

    def sliced(self, tenant: str) -> Slice | None:
        return self.slices.get(tenant)

    # ----------------------------------------------------------------- the request path
    def take(self, tenant: str, s: Slice, cost: int) -> Seat | None:
        """A seat from the slice, or None when it does not hold enough."""
        if (s.ss and s.used >= s.seats) or (s.sr and s.req < 1) or (s.st and s.tok < cost):
            return None
        if s.sr:
            s.req -= 1
        if s.st:
            s.tok -= cost
        s.used += 1
        s.busy = True
        self.local += 1
        if s.low() and tenant not in self._due:
            self._due.add(tenant)
            self._wake()
        return Seat(tenant, cost if s.st else 0, None, remote=True)

    async def admit(self, tenant: str, s: Slice, cost: int) -> Seat | Refusal | None:
        """A seat from the slice, after one adjustment call when it is empty; a refusal when Redis has
        nothing left; None when Redis did not answer (the caller's fallback decides)."""
        for _ in range(2):
            seat = self.take(tenant, s, cost)
            if seat is not None:
                return seat
            if s.refused is not None and time.monotonic() < s.refused_until:
                wait = s.refused_until - time.monotonic()
                return Refusal(s.refused.limit, wait)
            fut = s.call
            if fut is None:
                fut = s.call = asyncio.get_running_loop().create_future()
                # Shielded: the request that sent it may be cancelled; the others still wait for it.
                send = asyncio.shield(self._adjust_for(tenant, s, cost, fut))
                self._sending.add(send)
                send.add_done_callback(self._sending.discard)
            if not await asyncio.shield(fut):
                return None
        return self.take(tenant, s, cost) or s.refused or Refusal(Limit.CONCURRENCY, None)

    async def _adjust_for(self, tenant: str, s: Slice, cost: int, fut: asyncio.Future[bool]) -> None:
        ok = False
        try:
            ok = await self.adjust([(tenant, s, max(0.0, cost - s.tok) if s.st else 0.0, False)])
        finally:
            s.call = None
            fut.set_result(ok)

    def release(self, seat: Seat, used_tokens: int | None) -> bool:
        """Give a sliced seat back to its slice (False: not a sliced seat)."""
        s = self.slices.get(seat.tenant) or self.retired.get(seat.tenant)
        if s is None or s.used <= 0:
            return False
        s.used -= 1
        if used_tokens is not None and seat.charged_tokens:
            s.tok += seat.charged_tokens - used_tokens
        if (s.high() or seat.tenant in self.retired) and seat.tenant not in self._due:
            self._due.add(seat.tenant)
            self._wake()
        return True

    # ----------------------------------------------------------------- background
    def beat(self) -> None:
        """Once a beat: tenants idle since the last one give back what they hold spare."""
        for tenant, s in (*self.slices.items(), *self.retired.items()):
            if not s.busy and (s.req or s.tok > 0 or s.seats > s.used):
                self._due.add(tenant)
                self._idle.add(tenant)
            s.busy = False
        if self._due:
            self._wake()

    async def flush(self) -> bool:
        """Send the due top-ups and give-backs in one call; False when Redis did not answer."""
        if not self._due:
            return True
        due, idle = self._due, self._idle
        self._due, self._idle = set(), set()
        batch = []
        for tenant in sorted(due):
            s = self.slices.get(tenant) or self.retired.get(tenant)
            if s is not None:
                batch.append((tenant, s, 0.0, tenant in idle or tenant in self.retired))
        return not batch or await self.adjust(batch)

    async def adjust(self, batch: list[tuple[str, Slice, float, bool]]) -> bool:
        """One script call: for each (tenant, slice, tokens needed at once, idle) the slice topped up to
        one slice when below half (or empty), what exceeds two slices given back (all of it when idle).
        What is given back leaves the slice when the call is sent (a concurrent call cannot give it
        again); what is granted joins it when the answer comes. Not while the replica reconciles its
        seats (gateway.cluster.seatorder): what it asks for is worked out once it may go."""
        async with self._order.change():
            return await self._adjust(batch)

    async def _adjust(self, batch: list[tuple[str, Slice, float, bool]]) -> bool:
        keys = [self._members]
        args: list[Any] = [self.name]
        asked: list[tuple[int, int]] = []
        for tenant, s, need, idle in batch:
            spare = s.seats - s.used
            wr = wt = ws = gr = gs = 0
            gt = 0.0
            if idle:
                gr, gt, gs = s.req, max(0.0, s.tok), spare
            else:
                if s.sr:
                    wr, gr = _want(s.req, s.sr)
                if s.st:
                    wt_f, gt = _want_f(s.tok, s.st)
                    wt = math.ceil(wt_f)
                if s.ss:
                    ws, gs = _want(spare, s.ss)
            s.req -= gr
            s.tok -= gt
            s.seats -= gs
            s.asking += ws
            s.giving += gs
            asked.append((ws, gs))
            keys.append(f"{self.link.prefix}:tenant:{tenant}")
            args.append(f"{s.spec} {wr} {wt} {math.ceil(need)} {ws} {gr} {gt!r} {gs}")
        self.calls += 1
        got = await self.link.call("slice", lambda r: self._script(keys=keys, args=args, client=r))
        now = time.monotonic()
        for i, (_, s, _, _) in enumerate(batch):
            s.asking -= asked[i][0]
            s.giving -= asked[i][1]
            if got is None:
                continue
            j = 6 * i
            r_got, t_got, s_got = int(got[j]), float(text(got[j + 1])), int(got[j + 2])
            r_wait, t_wait, full = float(text(got[j + 3])), float(text(got[j + 4])), int(got[j + 5])
            s.req += r_got
            s.tok += t_got
            s.seats += s_got
            if r_wait >= 0 and s.req < 1:
                s.refused, s.refused_until = Refusal(Limit.REQUESTS, r_wait), now + r_wait
            elif t_wait >= 0:
                s.refused, s.refused_until = Refusal(Limit.TOKENS, t_wait), now + t_wait
            elif full and s.seats <= s.used:
                s.refused, s.refused_until = Refusal(Limit.CONCURRENCY, None), 0.0
            else:
                s.refused = None
        for tenant, s in list(self.retired.items()):
            if not (s.used or s.seats or s.req or s.tok > 0):
                del self.retired[tenant]
        return got is not None

    def held_seats(self, tenant: str) -> int:
        """Seats this replica holds in Redis for `tenant` through its slice, spare ones included, and
        those in calls under way (asked for or given back; none while the reconcile takes this count)."""
        n = 0
        for s in (self.slices.get(tenant), self.retired.get(tenant)):
            if s is not None:
                n += s.seats + s.asking + s.giving
        return n

    def document(self) -> dict[str, Any]:
        return {
            "slice_share": self.share,
            "sliced_tenants": len(self.slices),
            "slice_calls": self.calls,
            "slice_admissions": self.local,
        }


def _want(have: int, size: int) -> tuple[int, int]:
    """(units to ask for, units to give back) to bring `have` to one slice of `size`: ask below half of
    it (or at none), give back above two."""
    if have * 2 < size or have <= 0:
        return size - have, 0
    if have > 2 * size:
        return 0, have - size
    return 0, 0


def _want_f(have: float, size: int) -> tuple[float, float]:
    if have * 2 < size:
        return size - have, 0.0
    if have > 2 * size:
        return 0.0, have - size
    return 0.0, 0.0
