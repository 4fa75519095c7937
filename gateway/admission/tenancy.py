"""Tenants on the request path: their limits (gateway.admission.limits) and their usage, for metrics.

`admit` runs once a request's size is estimated (after the SLO is resolved) and raises 429
rate_limited with Retry-After when a limit of its tenant refuses it; `finish` runs in the front's
finish phase, which always runs, and gives the seat back with the tokens the request really used.
Usage is counted per tenant name, which comes from gateway.toml (a bounded set); requests without a
tenant count as "anonymous".
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Final, Literal, Protocol

from gateway.admission.limits import NO_LIMITS, Refusal, Seat, TenantLimiter, TenantLimits
from gateway.admission.slo import Tenant
from gateway.core import errors
from gateway.sched.request import SchedRequest

ANONYMOUS: Final = "anonymous"


def charge_of(sreq: SchedRequest) -> int:
    """The tokens a request may use, charged at admission: its prompt (estimated or counted) plus its
    max_tokens, or plus its predicted output length when it sets none."""
    out = sreq.max_tokens
    if out is None:
        out = math.ceil(sreq.predicted_output_tokens or 0.0)
    return max(0, sreq.prompt_tokens) + max(0, out)


class Ask(enum.Enum):
    """`admit_now`'s answer when the decision needs the cluster (await `admit_shared`)."""

    SHARED = "shared"


class SharedLimiter(Protocol):
    """Tenant limits shared by the replicas of a cluster (gateway.cluster.limits)."""

    def admit_now(self, tenant: str, limits: TenantLimits, tokens: int) -> Seat | None:
        """A seat decided on this replica alone (its slice of the limits), or None: `admit` decides."""

    def configure(self, limits: Mapping[str, TenantLimits], now: float) -> None:
        """The tenants' limits of a (re)load."""

    async def admit(self, tenant: str, limits: TenantLimits, tokens: int, now: float) -> Seat | Refusal:
        """A seat (remote, or local while the cluster cannot share) or a refusal; may raise a 503."""

    def release(self, seat: Seat, used_tokens: int | None, now: float) -> None:
        """Give a seat back (without awaiting: the release is sent in the background)."""


class TenantAccounting:
    def __init__(self, retry_after_s: float = 1.0) -> None:
        self.limiter = TenantLimiter()
        # Cluster mode: the limits are the cluster's (admit_shared); None: this process's own.
        self.shared: SharedLimiter | None = None
        # Retry-After of a concurrency refusal (no clock knows when a seat frees): limits.retry_after_s.
        self.retry_after_s = retry_after_s
        self.requests: dict[tuple[str, str], int] = {}  # (tenant, outcome) -> n
        self.prompt_tokens: dict[str, int] = {}
        self.completion_tokens: dict[str, int] = {}
        self.rate_limited: dict[tuple[str, str], int] = {}  # (tenant, limit) -> n

    def configure(self, tenants: Mapping[str, Tenant], now: float, *, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        limits = {name: t.limits for name, t in tenants.items()}
        self.limiter.configure(limits, now)
        if self.shared is not None:
            self.shared.configure(limits, now)

    def admit(self, tenant: Tenant | None, sreq: SchedRequest, now: float) -> Seat | None:
        """A seat under `tenant`'s limits (None: no tenant); raises 429 rate_limited."""
        if tenant is None or tenant.limits == NO_LIMITS:
            return None
        return self._seat(tenant, self.limiter.admit(tenant.name, charge_of(sreq), now))

    def admit_now(
        self, tenant: Tenant | None, sreq: SchedRequest, now: float
    ) -> Seat | Literal[Ask.SHARED] | None:
        """`admit` when it needs no round trip (no cluster, no limits, or a seat from this replica's slice
        of the cluster's limits); Ask.SHARED: await `admit_shared`."""
        if tenant is None or tenant.limits == NO_LIMITS or self.shared is None:
            return self.admit(tenant, sreq, now)
        got = self.shared.admit_now(tenant.name, tenant.limits, charge_of(sreq))
        return Ask.SHARED if got is None else got

    async def admit_shared(self, tenant: Tenant | None, sreq: SchedRequest, now: float) -> Seat | None:
        """`admit` under the cluster's shared limits (one Redis round trip for a tenant with limits)."""
        if tenant is None or tenant.limits == NO_LIMITS or self.shared is None:
            return self.admit(tenant, sreq, now)
        return self._seat(tenant, await self.shared.admit(tenant.name, tenant.limits, charge_of(sreq), now))

    def _seat(self, tenant: Tenant, got: Seat | Refusal) -> Seat:
        if isinstance(got, Refusal):
            key = (tenant.name, got.limit.value)
            self.rate_limited[key] = self.rate_limited.get(key, 0) + 1
            wait = self.retry_after_s if got.retry_after_s is None else got.retry_after_s
            raise errors.rate_limited(got.limit.value, float(max(1, math.ceil(wait))))
        return got

    def finish(
        self,
        tenant: str,
        seat: Seat | None,
        outcome: str,
        *,
        dispatched: bool,
        prompt_tokens: int | None,
        completion_tokens: int,
        now: float,
    ) -> None:
        """A request of `tenant` ended (any outcome): count it, give its seat back and correct its
        token charge (all of it back when it never reached an engine; the engine's usage when known)."""
        key = (tenant, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1
        if prompt_tokens:
            self.prompt_tokens[tenant] = self.prompt_tokens.get(tenant, 0) + prompt_tokens
        if completion_tokens:
            self.completion_tokens[tenant] = self.completion_tokens.get(tenant, 0) + completion_tokens
        if seat is None:
            return
        used: int | None
        if not dispatched:
            used = 0
        elif prompt_tokens is not None:
            used = prompt_tokens + completion_tokens
        else:
            used = None
        if seat.remote and self.shared is not None:
            self.shared.release(seat, used, now)
        else:
            self.limiter.release(seat, used, now)
