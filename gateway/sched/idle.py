"""A request's service alone on an idle endpoint, bounded over a model's ready endpoints by one set of
coefficients, and the latest clock time it can start and still keep its deadlines.

Idle service (`EndpointLoad.idle_service`: prefill ``k1·p + c1``, then ``out − 1`` decode iterations of a
batch of one, ``(k2·(p + out/2) + c2) + c3``, slowed by the prefill overhead) grows with every
coefficient, since prompt, context and steps are never negative. So the per-coefficient minimum over a
model's ready endpoints (`IdleBound.fastest`) bounds every endpoint's idle service from below, and the
maximum (`IdleBound.slowest`) from above. With one bound per model, a request's latest start
(`latest_start`: its deadlines less its idle service) is a number of its own that does not move with the
clock, so a queue can be kept ordered by it and checked against the clock without asking every
endpoint for every request (`gateway.sched.ranked`, the slack ordering, SLO admission's recheck).

A bound is kept while every coefficient stays within `REL_TOLERANCE` of it (`IdleBound.close_to`): a
refit that moves coefficients by less does not make a queue rank its requests again.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import is_not
from typing import Final, NamedTuple

from gateway.core.types import EndpointHealth, ModelName
from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.sched.request import SchedRequest
from gateway.sched.running import deadlines, output_estimate, remaining_max_tokens, resume_prompt_tokens
from gateway.sched.snapshot import EndpointView, FleetSnapshot, same_speed

#: Relative change of a coefficient below which a kept bound stays in force.
REL_TOLERANCE: Final = 0.02
_PRIOR: Final = default_prior()


@dataclass(frozen=True, slots=True)
class IdleBound:
    """Prefill and decode coefficients (`PerfCoefficients`' k1, c1, k2, c2, c3) of a bound."""

    k1: float
    c1: float
    k2: float
    c2: float
    c3: float

    @classmethod
    def of(cls, coefs: list[PerfCoefficients], *, slowest: bool) -> IdleBound:
        pick = max if slowest else min
        return cls(
            pick(c.k1 for c in coefs),
            pick(c.c1 for c in coefs),
            pick(c.k2 for c in coefs),
            pick(c.c2 for c in coefs),
            pick(c.c3 for c in coefs),
        )

    def close_to(self, other: IdleBound, rel: float = REL_TOLERANCE) -> bool:
        """Whether every coefficient of `other` is within `rel` of this one's."""
        return (
            abs(other.k1 - self.k1) <= rel * abs(self.k1)
            and abs(other.c1 - self.c1) <= rel * abs(self.c1)
            and abs(other.k2 - self.k2) <= rel * abs(self.k2)
            and abs(other.c2 - self.c2) <= rel * abs(self.c2)
            and abs(other.c3 - self.c3) <= rel * abs(self.c3)
        )

    def within(self, other: IdleBound) -> bool:
        """Whether no coefficient of this bound exceeds `other`'s (`other` bounds it from above)."""
        return (
            self.k1 <= other.k1
            and self.c1 <= other.c1
            and self.k2 <= other.k2
            and self.c2 <= other.c2
            and self.c3 <= other.c3
        )

    def scaled(self, factor: float) -> IdleBound:
        """Every coefficient times `factor` (a positive coefficient grows with a factor > 1; a negative
        one is kept, so the result still bounds this one from above)."""
        return IdleBound(*(max(c, c * factor) for c in (self.k1, self.c1, self.k2, self.c2, self.c3)))

    def times(self, prompt: float, out: float, alone: float) -> tuple[float, float]:
        """(first token, last token) seconds of `prompt` tokens in and `out` out, alone on an idle
        endpoint; `alone`: 1 + the prefill overhead a request alone is predicted with."""
        ttft = self.k1 * prompt + self.c1
        steps = out - 1.0 if out > 1.0 else 0.0
        return ttft, ttft + steps * ((self.k2 * (prompt + 0.5 * out) + self.c2) + self.c3) * alone


def fleet_bound(snap: FleetSnapshot, model: ModelName, *, slowest: bool) -> IdleBound | None:
    """The bound over the ready endpoints serving `model` (their fitted models, else the prior, as
    predictions use); None when none is ready. One pass, the same coefficients met once."""
    ready = EndpointHealth.READY
    seen: dict[int, PerfCoefficients] = {}
    for e in snap.endpoints:
        if model in e.models and e.health is ready:
            est = e.estimates
            coef = (est.perf if est is not None else None) or _PRIOR
            seen[id(coef)] = coef
    return IdleBound.of(list(seen.values()), slowest=slowest) if seen else None


#: Tuples of views (per model and length) whose speeds `KeptBounds` keeps track of, and bounds it keeps.
_SEEN_KEPT: Final = 16
_BOUNDS_KEPT: Final = 64
#: A value of `KeptBounds.epoch`: (model, number of views, serial).
SpeedEpoch = tuple[ModelName, int, int]


class KeptBounds:
    """`fleet_bound` per model, kept across snapshots while no ready endpoint of the model came, went or
    changed its estimates: a new tuple of views is compared with the last one of as many views entry by
    entry (most entries are the same objects; only those that are not are looked at), once per tuple
    (`epoch`), instead of collecting every endpoint's coefficients again. The same bound as
    `fleet_bound`. Whatever else rests only on the views' speeds (`same_speed`) can be kept per epoch
    too (SLO admission's fastest-first order). A snapshot with the memo of its views hands its speed
    token along (`ViewsMemo.speeds`, carried from one tuple to the next by the places the fleet
    replaced): a tuple with the token of the last one looked at is the same epoch without a walk."""

    __slots__ = ("_bounds", "_seen", "_serial")

    def __init__(self) -> None:
        # per (model, number of views): the last views looked at and the serial of their speeds
        self._seen: dict[tuple[ModelName, int], tuple[tuple[EndpointView, ...], int, object | None]] = {}
        self._serial = 0
        self._bounds: dict[tuple[SpeedEpoch, bool], IdleBound | None] = {}

    def epoch(
        self, views: tuple[EndpointView, ...], model: ModelName, speeds: object | None = None
    ) -> SpeedEpoch:
        """A value that stays equal while every view of `views` at each place has the same speed as at
        the last call with as many views (`same_speed`), and never comes back once they changed.
        `speeds`: the token of the memo of `views` (`ViewsMemo.speeds`): when the last views had the
        same one, every place has the same speed without looking."""
        at = (model, len(views))
        seen = self._seen
        got = seen.get(at)
        if got is not None:
            old, serial, kept = got
            if old is views:
                return (model, at[1], serial)
            if speeds is not None and speeds is kept:
                seen[at] = (views, serial, speeds)
                return (model, at[1], serial)
            # (the places whose view is another object found without a Python step per place)
            moved = list(map(is_not, views, old))
            if all(map(same_speed, compress(views, moved), compress(old, moved))):
                seen[at] = (views, serial, speeds)
                return (model, at[1], serial)
        self._serial = serial = self._serial + 1
        if len(seen) >= _SEEN_KEPT:
            seen.clear()  # (models or fleet sizes come and go: one tuple of views each)
        seen[at] = (views, serial, speeds)
        return (model, at[1], serial)

    def bound(self, snap: FleetSnapshot, model: ModelName, *, slowest: bool) -> IdleBound | None:
        key = (self.epoch(snap.endpoints, model, speeds_of(snap)), slowest)
        bounds = self._bounds
        if key in bounds:
            return bounds[key]
        if len(bounds) >= _BOUNDS_KEPT:
            bounds.clear()
        got = bounds[key] = fleet_bound(snap, model, slowest=slowest)
        return got


def speeds_of(snap: FleetSnapshot) -> object | None:
    """The speed token of the snapshot's views (`ViewsMemo.speeds`), when its memo is theirs."""
    memo = snap.memo
    return None if memo is None or memo.endpoints is not snap.endpoints else memo.speeds()


def output_bound(req: SchedRequest, gamma: float) -> float:
    """The output length predictions plan for (`EndpointLoad.output_tokens`): the mean plus `gamma`
    standard deviations, never past max_tokens."""
    mean, std = output_estimate(req)
    bound = mean + gamma * std
    cap = remaining_max_tokens(req)
    return bound if cap is None else min(bound, float(cap))


def latest_start(
    req: SchedRequest, bound: IdleBound, prompt: float, out: float, alone: float
) -> float | None:
    """The last clock time at which `req`, served alone at `bound`, still keeps its first-token and
    last-token deadlines; None when it has neither."""
    ttft_at, e2e_at = deadlines(req)
    return _latest_start(bound, prompt, out, ttft_at, e2e_at, alone=alone)


def _latest_start(
    bound: IdleBound, prompt: float, out: float, ttft_at: float | None, e2e_at: float | None, *, alone: float
) -> float | None:
    """`latest_start` from a request's terms (`IdleTerms`), without making them."""
    if ttft_at is None and e2e_at is None:
        return None
    ttft, e2e = bound.times(prompt, out, alone)
    if ttft_at is None:
        assert e2e_at is not None
        return e2e_at - e2e
    if e2e_at is None:
        return ttft_at - ttft
    return min(ttft_at - ttft, e2e_at - e2e)


class IdleTerms(NamedTuple):
    """What a request's service alone and its latest start take from the request, the same at every
    bound and clock: the tokens its next run prefills (`resume_prompt_tokens`), the output it is planned
    for (`output_bound`) and its deadlines (`deadlines`). Made once per request by a plugin that asks
    about the same request on many ticks (SLO admission's recheck); the same figures as asking again. (A
    named tuple: one is made per queued request, and a frozen dataclass takes several times as long.)"""

    prompt: float
    out: float
    ttft_at: float | None
    e2e_at: float | None

    @staticmethod
    def of(req: SchedRequest, gamma: float) -> IdleTerms:
        ttft_at, e2e_at = deadlines(req)
        return IdleTerms(float(resume_prompt_tokens(req)), output_bound(req, gamma), ttft_at, e2e_at)

    def left(self, now: float) -> tuple[float | None, float | None]:
        """`gateway.sched.targets.time_left` at `now`."""
        ttft_at, e2e_at = self.ttft_at, self.e2e_at
        return (None if ttft_at is None else ttft_at - now), (None if e2e_at is None else e2e_at - now)

    def latest_start(self, bound: IdleBound, alone: float) -> float | None:
        """The last clock time at which its request, served alone at `bound` (`alone`: 1 + the prefill
        overhead), still keeps its deadlines; None when it has neither."""
        prompt, out, ttft_at, e2e_at = self
        return _latest_start(bound, prompt, out, ttft_at, e2e_at, alone=alone)
