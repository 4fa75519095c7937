"""SLO admission finds the seat a request waits for over the loads' arrays (`SeatOrder` over the load
cache's `refs`: the loads to be made derived together, `load_batch.derive`) and decides as it does over
made loads one by one (hypothesis: random fleets of up to 40 endpoints with running requests that have
targets, progress reports, max_tokens and preemptible batch work; the clock moving within and past the
loads' reuse time, dispatches, completions and progress reports; requests with every kind of target,
queued counts on both sides of the free seats; with and without columns and preemption): the same
outcome, reason, message and retry-after, and every pending load's predicted ends those of its load. An
order renewed from step to step (only the remade loads' ends replaced) answers every k-th as one made
anew, and so does a first question answered by a partition."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import cast
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.slo import Infeasible, SloClass, SloKind, SloPolicy
from gateway.core.types import InstanceClass
from gateway.sched.columns import columns_of
from gateway.sched.interfaces import PreemptionRules
from gateway.sched.load_batch import Pending, derive
from gateway.sched.loads import REUSE_S, LoadCache
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.admission import seat_order
from gateway.sched.plugins.admission.seat_order import RENEW_SHARE, SEAT_ENDS_FROM, SORT_UP_TO, SeatOrder
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter, SloFeasibilityParams
from gateway.sched.predict import EndpointLoad, Prediction
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest, with_progress
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from tests.unit.fleet_steps import advance
from tests.unit.slo_fixtures import COEF, SLOW, req, running, view

NOW = 10.0
SLO = SloPolicy(
    classes={
        "chat": SloClass("chat", kind=SloKind.INTERACTIVE, band=0, on_infeasible=Infeasible.REJECT),
        "held": SloClass("held", kind=SloKind.INTERACTIVE, band=1, on_infeasible=Infeasible.HOLD),
        "batch": SloClass("batch", kind=SloKind.BATCH, band=2, on_infeasible=Infeasible.BEST_EFFORT),
    },
    default_class="chat",
)
RULES = PreemptionRules(classes=frozenset({InstanceClass.MIXED}), max_victims=2)

_run = st.tuples(
    st.integers(min_value=1, max_value=3000),  # prompt
    st.floats(min_value=1.0, max_value=300.0),  # predicted output
    st.floats(min_value=0.0, max_value=5.0),  # age
    st.one_of(st.none(), st.floats(min_value=-1.0, max_value=30.0)),  # last-token deadline from now
    st.one_of(st.none(), st.integers(min_value=0, max_value=400)),  # tokens reported
    st.one_of(st.none(), st.integers(min_value=1, max_value=500)),  # max_tokens
    st.booleans(),  # batch work (preemptible)
)
Run = tuple[int, float, float, float | None, int | None, int | None, bool]
Endpoint = tuple[int, list[Run], PerfCoefficients | None]
_endpoint = st.tuples(
    st.integers(min_value=1, max_value=8),  # cap
    st.lists(_run, max_size=10),
    st.sampled_from((COEF, SLOW, None)),  # None: the generic prior (a guess)
)
# A step: (clock advance in ms, up to three times the shortest reuse time of a load, endpoint, what
# happens there: 0 nothing, 1 a progress report, 2 a dispatch, 3 a completion), the request's class, its
# targets, the requests queued per class.
_step = st.tuples(
    st.integers(min_value=0, max_value=round(3000 * REUSE_S)),
    st.integers(min_value=0, max_value=39),
    st.integers(min_value=0, max_value=3),
    st.sampled_from(("chat", "held", "batch")),
    st.tuples(
        st.one_of(st.none(), st.floats(min_value=10.0, max_value=3000.0)),
        st.one_of(st.none(), st.floats(min_value=100.0, max_value=30000.0)),
        st.one_of(st.none(), st.floats(min_value=5.0, max_value=60.0)),
    ),
    st.one_of(st.integers(min_value=0, max_value=12), st.integers(min_value=0, max_value=300)),
)


def _running(name: str, run: Run, now: float) -> RunningRequest:
    p, o, age, e2e, reported, max_tokens, batch = run
    r = running(
        name,
        prompt=p,
        out=o,
        std=o / 4,
        dispatched_at=now - age,
        e2e_deadline=None if e2e is None else now + e2e,
        cls="batch" if batch else "chat",
    )
    r = dataclasses.replace(r, max_tokens=max_tokens, resumable=batch)
    if reported is not None and age > 0.05:
        r = with_progress(r, reported, now - age + 0.05, now - age / 2)
    return r


def step_request(
    serial: int,
    now: float,
    cls: str,
    targets: tuple[float | None, float | None, float | None],
    scale: float = 1.0,
) -> SchedRequest:
    """A step's request: its class and its (first-token, last-token, per-token) targets in ms, times
    `scale`, arrived 50 ms before `now`."""
    ttft, e2e, itl = targets
    return req(
        f"r{serial}",
        arrival=now - 0.05,
        prompt=500,
        out=120.0,
        ttft_ms=None if ttft is None else ttft * scale,
        e2e_ms=None if e2e is None else e2e * scale,
        itl_ms=None if itl is None else itl * scale,
        cls=cls,
    )


def _view(k: int, endpoint: Endpoint) -> EndpointView:
    cap, runs, coef = endpoint
    rs = [_running(f"e{k}-x{j}", run, NOW) for j, run in enumerate(runs[:cap])]
    v = view(f"e{k:02d}", cap=cap, runs=rs, coef=COEF if coef is None else coef)
    return v if coef is not None else dataclasses.replace(v, estimates=None)  # the generic prior


class _Plain(SloFeasibilityAdmitter):
    """The same admission with the seat it waits for found over made loads, in Python: every load made,
    its `seat_free` list taken with its index, sorted."""

    def _after(self, req: SchedRequest, loads: Sequence[EndpointLoad | Pending], k: int) -> list[Prediction]:
        made = [load.load() if isinstance(load, Pending) else load for load in loads]
        ordered = sorted((t, i) for i, load in enumerate(made) for t in load.seat_free)
        if k >= len(ordered):
            return []
        t, i = ordered[k]
        return [made[i].predict_after(req, t)]


@settings(max_examples=200, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=40),
    steps=st.lists(_step, min_size=1, max_size=10),
    preempts=st.booleans(),
    columns=st.booleans(),
    assume_full=st.booleans(),
    ks=st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=4),
    batch_from=st.sampled_from((1, 4, SEAT_ENDS_FROM)),
    warm=st.sampled_from((0, 1, 2)),
    share=st.sampled_from((0.0, RENEW_SHARE, 1.0)),
    sort_up_to=st.sampled_from((SORT_UP_TO, 1 << 30)),
)
def test_the_seat_it_waits_for_is_found_over_arrays_with_the_same_answer(  # noqa: PLR0917
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int, str, tuple[float | None, float | None, float | None], int]],
    preempts: bool,
    columns: bool,
    assume_full: bool,
    ks: list[int],
    batch_from: int,
    warm: int,
    share: float,
    sort_up_to: int,
) -> None:
    with mock.patch.object(seat_order, "SORT_UP_TO", sort_up_to):  # 1 << 30: a first question sorts
        _same_answers(endpoints, steps, preempts, columns, assume_full, ks, batch_from, warm, share)


def _same_answers(  # noqa: PLR0917
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int, str, tuple[float | None, float | None, float | None], int]],
    preempts: bool,
    columns: bool,
    assume_full: bool,
    ks: list[int],
    batch_from: int,
    warm: int,
    share: float,
) -> None:
    """`batch_from`: the admitter's `seat_ends_from` (1: every pending load's ends as arrays, however few);
    `warm`: every how many endpoints a pending load's rows are made on its pace before each step, as
    placement over columns makes them (0: none)."""
    params = SloFeasibilityParams(margin=1.0, retry_after_s=0.5, assume_full=assume_full, recheck="off")
    rules = RULES if preempts else None
    cache = LoadCache(params.predict_params())
    new = SloFeasibilityAdmitter(params, SLO, cache, preemption=rules)
    new.seat_ends_from = batch_from
    new._sure = None  # every question to the seat order (the sure admission: test_admission_seat_bound)
    plain_cache = LoadCache(params.predict_params())
    plain = _Plain(params, SLO, plain_cache, preemption=rules)
    plain._sure = None
    probe = LoadCache(params.predict_params())
    views = tuple(_view(k, e) for k, e in enumerate(endpoints))
    cols = columns_of(views)
    now = NOW
    renewed: SeatOrder | None = None  # renewed from step to step (`share` of the loads changed at most)
    for serial, (dt_ms, at, what, cls, targets, queued) in enumerate(steps):
        now += dt_ms / 1000.0
        views, cols, _ = advance(views, cols, now, at=at, what=what, serial=serial)
        s = FleetSnapshot(now=now, endpoints=views, columns=cols if columns else None)
        if warm:
            # (every cache asked at the same times: a load's time is that of the first question)
            _warm(cache, views, now, warm)
            _warm(plain_cache, views, now, warm)
            _warm(probe, views, now, warm)
        r = step_request(serial, now, cls, targets)

        def waiting(c: str, n: int = queued) -> int:
            return n if c == "chat" else n // 3

        assert new.admit(r, s, waiting) == plain.admit(r, s, waiting)
        # the ends of the loads to be made, derived as arrays, are their loads' own
        refs = probe.refs(list(views), now)  # (a cache of its own: the admitters' caches stay alike)
        order = SeatOrder(refs, batch_from)
        renewed = SeatOrder(refs, batch_from) if renewed is None else renewed.renewed(refs, share)
        made = [ref.load() if isinstance(ref, Pending) else ref for ref in refs]
        for ref, load in zip(refs, made, strict=True):
            if isinstance(ref, Pending) and ref.seat_free is not None:
                assert sorted(ref.seat_free.tolist()) == load.seat_free
        ordered = sorted((t, i) for i, load in enumerate(made) for t in load.seat_free)
        for kth in ks:
            want = ordered[kth] if kth < len(ordered) else None
            assert order.kth(kth) == want
            assert renewed.kth(kth) == want


def _warm(cache: LoadCache, views: Sequence[EndpointView], now: float, every: int) -> None:
    """The rows of every `every`-th endpoint's pending load made on its pace (`Pace.arrays`), as a
    batch of placement over columns makes them, the load left pending."""
    refs = cache.refs(views, now)
    todo = [
        ref for k, ref in enumerate(refs) if k % every == 0 and isinstance(ref, Pending) and ref.made is None
    ]
    if todo:
        derive([(p.view, p.now, p.pace) for p in todo], todo[0].params, ())


def test_a_cache_without_pending_loads_orders_as_before() -> None:
    cache = LoadCache(SloFeasibilityParams().predict_params())
    views = [
        view(f"e{i}", cap=2, runs=[running(f"x{i}{j}", out=10.0 * (i + j + 1)) for j in range(2)])
        for i in range(3)
    ]
    loads = cache.loads(views, NOW)
    order = SeatOrder(loads)
    ordered = sorted((t, i) for i, load in enumerate(loads) for t in load.seat_free)
    assert [order.kth(k) for k in range(7)] == [*ordered, None]


class _Made:
    """What `SeatOrder` reads of a made load: its ends and its memo."""

    def __init__(self, ends: list[float]) -> None:
        self.seat_free = sorted(ends)
        self.memo: dict[str, object] = {}


# ties across loads (signed zeros among them), ends at infinity, empties
_ends = st.lists(st.sampled_from((-0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, math.inf)), max_size=5)


@settings(max_examples=300, deadline=None)
@given(
    first=st.lists(_ends, min_size=1, max_size=12),
    steps=st.lists(
        st.tuples(st.lists(st.tuples(st.integers(0, 11), _ends), max_size=4), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    sort_up_to=st.sampled_from((SORT_UP_TO, 1 << 30)),
)
def test_a_renewed_order_answers_every_kth_as_one_made_anew(
    first: list[list[float]], steps: list[tuple[list[tuple[int, list[float]]], bool]], sort_up_to: int
) -> None:
    """Asked or not between renewals, by a sort or (a first question) by a partition: the k-th end
    itself (a zero's sign too) and its load."""
    loads: list[EndpointLoad] = [cast("EndpointLoad", _Made(e)) for e in first]
    renewed = SeatOrder(loads)
    with mock.patch.object(seat_order, "SORT_UP_TO", sort_up_to):
        for step, asked in steps:
            loads = list(loads)
            for at, ends in step:
                loads[at % len(loads)] = cast("EndpointLoad", _Made(ends))
            renewed = renewed.renewed(loads, share=1.0)
            if not asked:
                continue
            ordered = sorted((t, i) for i, load in enumerate(loads) for t in load.seat_free)
            for k in [*range(len(ordered) + 1), *range(len(ordered) - 1, -1, -1)]:
                fresh = SeatOrder(loads)
                want = ordered[k] if k < len(ordered) else None
                got = renewed.kth(k)
                assert got == fresh.kth(k) == want
                if got is not None and want is not None:  # the end itself, its sign too
                    assert math.copysign(1.0, got[0]) == math.copysign(1.0, want[0])
