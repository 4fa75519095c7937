"""What an endpoint's load (`gateway.sched.predict.EndpointLoad`) is made of: the terms it takes from its
view alone, whatever the clock (`Pace`, `same_inputs`, and each running request's `request_terms`), and
each running request's estimated state as of the load's time (`states_of`, `RunningState`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter
from typing import Final, Protocol

from gateway.sched.perf import PerfCoefficients
from gateway.sched.running import RunningRequest, kept_of
from gateway.sched.snapshot import EndpointView

#: A running request past its predicted length is expected to run this share of its length again.
LONG_GROWTH: Final = 0.5
#: Prefill share of an endpoint's time at most (decoding then takes twice as long): a snapshot of a few
#: running requests is a noisy sample of the mix.
_MAX_PREFILL_SHARE: Final = 0.5


class RunningState:
    """A running request as of `now` (estimated). A plain class rather than a frozen dataclass: a load
    asked for its running states makes one per running request, on the scheduler's hot path; treat them
    as read-only once made."""

    __slots__ = ("finish_s", "first_s", "long", "prefilled", "produced", "remaining", "req")

    # Positional on purpose: built once per running request of a load, where keywords cost time.
    def __init__(  # noqa: PLR0917
        self,
        req: RunningRequest,
        prefilled: bool,
        produced: float,
        remaining: float,
        finish_s: float,
        first_s: float,
        long: float,
    ) -> None:
        self.req = req
        self.prefilled = prefilled  # its first token is (estimated to be) out
        self.produced = produced  # output tokens so far
        self.remaining = remaining  # output tokens still to come (tail-adjusted)
        self.finish_s = finish_s  # seconds from now until its last token at the current per-token time
        self.first_s = first_s  # seconds from now until its first token (<= 0: out already)
        self.long = long  # how far past its predicted length it is (0: not running long), relative

    @property
    def context(self) -> float:
        return self.req.prompt_tokens + self.produced

    def __repr__(self) -> str:
        return (
            f"RunningState({self.req.id!r}, prefilled={self.prefilled}, produced={self.produced:.1f}, "
            f"remaining={self.remaining:.1f}, finish_s={self.finish_s:.3f})"
        )


def same_inputs(view: EndpointView, other: EndpointView) -> bool:
    """Whether a load of `other` takes from its view what a load of `view` takes (the same endpoint,
    coefficients, KV capacity, seats and running requests, whatever their progress): e.g. views apart
    only in engine gauges, measured EWMAs or progress reports (`Pace` reads no progress)."""
    if view is other:
        return True
    return (
        view.id == other.id
        and view.perf is other.perf
        and view.kv_capacity_tokens == other.kv_capacity_tokens
        and view.cap == other.cap
        and view.max_batch == other.max_batch
        and same_requests(view.running, other.running)
    )


def same_requests(running: tuple[RunningRequest, ...], other: tuple[RunningRequest, ...]) -> bool:
    """Whether two running tuples of one endpoint hold the same requests in the same order, apart at
    most in the progress each reported (`gateway.sched.running.KEPT_FIELDS` equal). Each record's kept
    fields are taken once and kept on it (`RunningRequest.kept`, handed on by `with_progress`): the
    records of one running request before and after its progress reports then share one tuple, compared
    by identity (asked for every load remade and every view apart from its load's; on a busy fleet
    nearly every record is a progress copy)."""
    if running is other:
        return True
    if len(running) != len(other):
        return False
    for r, o in zip(running, other, strict=True):
        if r is o:
            continue
        a = r.kept or kept_of(r)
        b = o.kept or kept_of(o)
        if a is not b and a != b:
            return False
    return True


def progress_only(view: EndpointView, old: EndpointView) -> bool:
    """Whether `view` differs from `old`, an earlier view of the same endpoint, at most in its running
    requests' progress reports and the token counters they advance (`streamed_tokens`, `gap_*`), and in
    the measured EWMAs of its estimates (which no load reads, nor any plugin through a load): the same
    running requests, seats, cap, health, models, coefficients, KV capacity, engine gauges and
    specification. A load of `old` estimates that progress from the clock, so it stands for `view` as
    it stands for `old` at a later time (`LoadCache`)."""
    if view is old:
        return True
    return (
        _FIELDS(view) == _FIELDS(old)
        and view.health is old.health
        and (view.estimates is old.estimates or _same_fit(view, old))
        and view.running_prompt_tokens == old.running_prompt_tokens
        and view.running_output_tokens == old.running_output_tokens
        and view.engine_running == old.engine_running
        and view.engine_waiting == old.engine_waiting
        and view.kv_usage == old.kv_usage
        and view.scraped_at == old.scraped_at
        and view.cut_at == old.cut_at
        and same_requests(view.running, old.running)
    )


#: The fields `progress_only` compares with == that no NaN can be in (ints, strs, sets of str, None):
#: taken and compared as tuples in C (a tuple's == takes two identical items as equal; for these that is
#: what == says). The floats are compared one by one (a NaN is equal to nothing).
_FIELDS: Final = attrgetter(
    "id",
    "inflight",
    "cap",
    "max_cap",
    "dispatched_since_scrape",
    "completed_since_scrape",
    "models",
    "url",
    "engine",
    "instance_class",
    "node",
    "priority_scheduling",
    "max_batch",
    "config",
)


class Pace:
    """What an endpoint's load takes from its view alone, whatever the clock: each running request's
    prefill tokens, the batch's prefill share and the per-token pace before progress is known. A load
    of the same view at a later time (`LoadCache` remakes loads 100-200 ms apart while nothing changed
    there) starts from these instead of deriving them again."""

    __slots__ = ("arrays", "fresh", "guess", "overhead", "terms")

    def __init__(self, fresh: list[int], overhead: float, guess: float) -> None:
        self.fresh = fresh
        self.overhead = overhead
        self.guess = guess
        # The running requests' fields a load reads besides their progress, as an array (one row per
        # request), made when loads are derived many at once (`gateway.sched.load_batch`).
        self.arrays: object | None = None
        # The same as tuples, for the loads made one at a time (`gateway.sched.predict.request_terms`),
        # with the coefficients and gamma they were made for: (coefficients, gamma, terms).
        self.terms: tuple[object, float, object] | None = None


def pace_of(view: EndpointView, coef: PerfCoefficients, prefill_overhead: float) -> Pace:
    reqs = view.running
    n = len(reqs)
    base_ctx = sum([r.prompt_tokens for r in reqs])
    base = coef.decode_iter_s(n, base_ctx / n) if n else 0.0
    # Prefills pause the batch: each running request's prefill, over its lifetime, is the share of
    # time the endpoint spends prefilling requests like it (a steady state of this batch).
    k1, c1 = coef.k1, coef.c1
    rho = 0.0
    # Each running request's prefill tokens (its uncached ones), once: `RunningRequest.prefill_tokens`
    # inlined (this runs per running request on every placement).
    fresh = [
        r.prompt_tokens if r.cached_tokens <= 0 else max(1, r.prompt_tokens - r.cached_tokens) for r in reqs
    ]
    for r, f in zip(reqs, fresh, strict=True):
        pre = k1 * f + c1
        life = pre + r.output_mean * base
        rho += pre / life if life > 0 else 0.0
    rho = min(rho, _MAX_PREFILL_SHARE)
    overhead = max(prefill_overhead, rho / (1.0 - rho))
    # Per-token time of the current batch; contexts are refined once progress is known.
    return Pace(fresh, overhead, base * (1.0 + overhead))


def _same_fit(view: EndpointView, old: EndpointView) -> bool:
    """Whether two views' estimates give the same coefficients and KV capacity (a refresh that moved
    only the measured EWMAs, or refit them to the same numbers)."""
    perf = view.perf
    return (perf is old.perf or perf == old.perf) and view.kv_capacity_tokens == old.kv_capacity_tokens


class PaceParams(Protocol):
    """What of a load's prediction parameters (`gateway.sched.predict.PredictParams`) its pace reads."""

    @property
    def prefill_overhead(self) -> float: ...


class Like(Protocol):
    """A load of an endpoint at another time (`gateway.sched.predict.EndpointLoad`, or one decided on
    and not made yet: `gateway.sched.load_batch.Pending`)."""

    @property
    def view(self) -> EndpointView: ...
    @property
    def params(self) -> PaceParams: ...
    @property
    def pace(self) -> Pace: ...


def pace_for(view: EndpointView, coef: PerfCoefficients, params: PaceParams, like: Like | None) -> Pace:
    """What a load of `view` takes from its view alone: `like`'s when its view has the same inputs and
    its parameters are the same, else derived."""
    if like is not None and (like.params is params or like.params == params) and same_inputs(like.view, view):
        return like.pace
    return pace_of(view, coef, params.prefill_overhead)


#: A running request's state now: prefilled, tokens produced, tokens remaining, its first token's time
#: from now, how far past its predicted length it ran (a share of it).
State = tuple[bool, float, float, float, float]


#: What `gateway.sched.predict.running_states` reads of a running request besides its progress, for
#: one pace, coefficients and gamma: its first token's time estimated from its dispatch, its
#: tail-adjusted output mean, its max tokens (inf: none), its output mean, its prompt tokens and its
#: prefill tokens (kept on the pace: `Pace.terms`).
RequestTerms = tuple[float, float, float, float, int, int]


def request_terms(
    reqs: Sequence[RunningRequest], fresh: Sequence[int], *, k1: float, c1: float, guess: float, gamma: float
) -> list[RequestTerms]:
    """`RequestTerms` of each of `reqs` (`fresh`: its prefill tokens), each term `running_states`'
    arithmetic in its order."""
    inf = math.inf
    return [
        (
            r.dispatched_at + k1 * f + c1 + 0.5 * guess,
            r.output_mean + gamma * r.output_std,
            inf if r.max_tokens is None else float(r.max_tokens),
            r.output_mean,
            r.prompt_tokens,
            f,
        )
        for r, f in zip(reqs, fresh, strict=True)
    ]


def states_of(
    reqs: Sequence[RunningRequest], terms: Sequence[RequestTerms], now: float, guess: float
) -> tuple[list[State], float, float, float]:
    """`running_states` from the requests' `request_terms` (made for the same coefficients, gamma and
    pace): the same numbers, each request's progress read from its record."""
    states: list[State] = []
    add = states.append
    ctx_sum = 0.0
    pending = 0.0
    long_total = 0.0
    inf = math.inf
    for r, (est_first, mean, cap, om, prompt, f) in zip(reqs, terms, strict=True):
        reported = r.produced
        reported_at = r.reported_at
        first_at = r.first_token_at
        produced: float
        if reported is not None and reported_at is not None and first_at is not None:
            prefilled = True
            produced = reported + ((now - reported_at) / guess if guess > 0 else 0.0)
        else:
            first_at = est_first
            prefilled = now >= first_at
            produced = (now - first_at) / guess + 1.0 if prefilled and guess > 0 else 0.0
        if cap < produced:  # noqa: PLR1730 (min() is a call per running request)
            produced = cap
        if produced < mean:
            remaining = mean - produced
            long = 0.0
        else:
            grown = LONG_GROWTH * produced
            remaining = grown if grown > 1.0 else 1.0
            long = (produced - om) / (om if om > 1.0 else 1.0)
        if cap < inf:
            room = cap - produced
            remaining = room if room < remaining else remaining
            remaining = remaining if remaining > 0.0 else 0.0
        if not prefilled:
            pending += f
        ctx_sum += prompt + produced
        long_total += long
        add((prefilled, produced, remaining, first_at - now, long))
    return states, pending, ctx_sum, long_total
