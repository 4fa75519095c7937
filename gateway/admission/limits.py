"""Per-tenant rate limits and quotas, sans-IO: token buckets and seat counts on an injected clock.

Each tenant may have three limits ([[tenants]] in gateway.toml):
- `requests_per_s`: a bucket of requests that refills at that rate and holds one second's worth (at
  least one request);
- `tokens_per_min`: a bucket of tokens that refills at tokens_per_min / 60 per second and holds one
  minute's worth. A request is charged at admission what it may use (its prompt-token estimate plus its
  max_tokens, or plus its predicted output length when it sets none) and corrected when it finishes by
  what the engine reported it used (the difference is given back, or taken, then); a request that never
  reached an engine gets its whole charge back. A request is let in when the bucket holds its charge, or
  is full when the charge is larger than the bucket (it then leaves the bucket in debt, so one huge
  request is not refused forever but delays the next ones);
- `max_concurrency`: requests in flight at once (a seat, given back in the front's finish phase).

`admit` takes nothing unless every limit lets the request in; a refusal says which limit and how many
seconds until its bucket has room (`retry_after_s`, None for a concurrency limit: no clock can tell when
a seat frees). `configure` (reload) keeps the state of tenants whose limits did not change; a changed
tenant keeps its seats in flight and its buckets' levels, capped by the new sizes; a removed tenant's
seats still release into the state they came from (nothing counts them any more).
Nothing here awaits, logs or reads a clock: `now` is passed in.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final


class Limit(enum.StrEnum):
    """Which limit refused a request (the `limit` label of the rate-limit metric)."""

    REQUESTS = "requests_per_s"
    TOKENS = "tokens_per_min"
    CONCURRENCY = "max_concurrency"


@dataclass(frozen=True, slots=True)
class TenantLimits:
    requests_per_s: float | None = None
    tokens_per_min: int | None = None
    max_concurrency: int | None = None

    @property
    def any(self) -> bool:
        return (
            self.requests_per_s is not None
            or self.tokens_per_min is not None
            or self.max_concurrency is not None
        )


NO_LIMITS: Final = TenantLimits()


class TokenBucket:
    """`capacity` units, refilled at `rate` per second; `level` may go below zero (debt)."""

    __slots__ = ("capacity", "level", "rate", "updated")

    def __init__(self, rate: float, capacity: float, now: float, level: float | None = None) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError("a bucket needs a positive rate and capacity")
        self.rate = rate
        self.capacity = capacity
        self.level = capacity if level is None else min(level, capacity)
        self.updated = now

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def wait_s(self, cost: float, now: float) -> float:
        """Seconds until `cost` may be taken (0: now); a cost above the capacity needs a full bucket."""
        self.refill(now)
        need = min(cost, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, amount: float) -> None:
        self.level -= amount

    def give(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount)


class _TenantState:
    __slots__ = ("inflight", "limits", "requests", "tokens")

    def __init__(self, limits: TenantLimits, now: float) -> None:
        self.inflight = 0
        self.requests: TokenBucket | None = None
        self.tokens: TokenBucket | None = None
        self.limits = TenantLimits()
        self.apply(limits, now)

    def apply(self, limits: TenantLimits, now: float) -> None:
        """Take new limits in place (seats in flight point at this object); a kept bucket keeps its
        level, capped by its new size."""
        self.limits = limits
        self.requests = _resized(self.requests, limits.requests_per_s, now, per_s=1.0)
        tpm = limits.tokens_per_min
        self.tokens = _resized(self.tokens, None if tpm is None else float(tpm), now, per_s=60.0)


def _resized(
    old: TokenBucket | None, amount: float | None, now: float, *, per_s: float
) -> TokenBucket | None:
    """A bucket refilling `amount` per `per_s` seconds and holding `amount` (at least 1); None: no limit."""
    if amount is None:
        return None
    level = None
    if old is not None:
        old.refill(now)
        level = old.level
    return TokenBucket(amount / per_s, max(1.0, amount), now, level)


@dataclass(slots=True)
class Seat:
    """A request let in under its tenant's limits; give it back with `TenantLimiter.release`, once."""

    tenant: str
    charged_tokens: int
    _state: _TenantState | None
    released: bool = False
    # Taken in the cluster's shared limits (Redis, gateway.cluster.limits): given back there.
    remote: bool = False


@dataclass(frozen=True, slots=True)
class Refusal:
    limit: Limit
    retry_after_s: float | None  # None: unknown (a concurrency limit)


def scaled(limits: TenantLimits, share: float) -> TenantLimits:
    """`limits` times `share` (0 < share <= 1): one replica's part of a tenant's limits when the cluster
    cannot share them; every limit stays at least 1."""
    rps = limits.requests_per_s
    tpm = limits.tokens_per_min
    conc = limits.max_concurrency
    return TenantLimits(
        requests_per_s=None if rps is None else rps * share,
        tokens_per_min=None if tpm is None else max(1, int(tpm * share)),
        max_concurrency=None if conc is None else max(1, int(conc * share)),
    )


class TenantLimiter:
    def __init__(self) -> None:
        self._states: dict[str, _TenantState] = {}

    def configure(self, limits: Mapping[str, TenantLimits], now: float) -> None:
        """Take the limits of a (re)load; unchanged tenants keep their buckets and seats."""
        states: dict[str, _TenantState] = {}
        for name, lim in limits.items():
            if not lim.any:
                continue
            state = self._states.get(name)
            if state is None:
                state = _TenantState(lim, now)
            elif state.limits != lim:
                state.apply(lim, now)
            states[name] = state
        self._states = states

    def admit(self, tenant: str, tokens: int, now: float) -> Seat | Refusal:
        """Let a request of `tenant` that may use `tokens` in, or say which limit refuses it."""
        state = self._states.get(tenant)
        if state is None:
            return Seat(tenant, 0, None)
        lim = state.limits
        if lim.max_concurrency is not None and state.inflight >= lim.max_concurrency:
            return Refusal(Limit.CONCURRENCY, None)
        if state.requests is not None:
            wait = state.requests.wait_s(1.0, now)
            if wait > 0:
                return Refusal(Limit.REQUESTS, wait)
        if state.tokens is not None:
            wait = state.tokens.wait_s(tokens, now)
            if wait > 0:
                return Refusal(Limit.TOKENS, wait)
        if state.requests is not None:
            state.requests.take(1.0)
        charged = 0
        if state.tokens is not None:
            state.tokens.take(tokens)
            charged = tokens
        state.inflight += 1
        return Seat(tenant, charged, state)

    def release(self, seat: Seat, used_tokens: int | None, now: float) -> None:
        """The request ended: free its seat and correct its token charge by `used_tokens` (what the
        engine reported; None: unknown, the charge stays). A second release does nothing."""
        if seat.released:
            return
        seat.released = True
        state = seat._state
        if state is None:
            return
        state.inflight -= 1
        if state.tokens is not None and used_tokens is not None and seat.charged_tokens:
            state.tokens.refill(now)
            state.tokens.give(seat.charged_tokens - used_tokens)

    def inflight(self, tenant: str) -> int:
        state = self._states.get(tenant)
        return 0 if state is None else state.inflight

    def level(self, tenant: str, limit: Limit, now: float) -> float | None:
        """What the bucket of `limit` holds for `tenant` now (None: no such bucket)."""
        state = self._states.get(tenant)
        if state is None:
            return None
        bucket = (
            state.requests if limit is Limit.REQUESTS else state.tokens if limit is Limit.TOKENS else None
        )
        if bucket is None:
            return None
        bucket.refill(now)
        return bucket.level
