"""SLO admission's free-seat walk done a cheaper way, pinned to the plain way: `misses_everywhere`
(`EndpointLoad.predict` spelled out, no `Prediction` per endpoint) against a prediction per load judged by
`SloFeasibilityAdmitter._meets`, stopping at the same load; `LoadCache.each` against `load` per view, two
caches side by side through the same changes of a fleet, stopped early as the walk stops; the ready
endpoints' free seats from the snapshot's memo against those from its columns and the plain list."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from typing import Literal

from hypothesis import event, given, settings
from hypothesis import strategies as st

from gateway.core.slo import SloPolicy
from gateway.core.types import EndpointHealth, ModelName
from gateway.sched.columns import columns_of
from gateway.sched.loads import REUSE_S, LoadCache
from gateway.sched.plugins.admission.free_seat import misses_everywhere
from gateway.sched.plugins.admission.ready import ReadySeats
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter, SloFeasibilityParams
from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.prediction import seats_of
from gateway.sched.snapshot import EndpointView, FleetSnapshot, ViewsMemo
from gateway.sched.targets import time_left
from tests.unit.fleet_steps import ENDPOINT, NEW_REQUEST, NOW, Endpoint, new_request, view_of
from tests.unit.slo_fixtures import view
from tests.unit.test_sched_load_query import _STEPS, _run, _same, fleet_step
from tests.unit.test_sched_load_query import _state as _numbers

_R = dataclasses.replace


class _Counted:
    """An iterator over `items` that counts what was taken from it."""

    def __init__(self, items: list[EndpointLoad]) -> None:
        self._it = iter(items)
        self.taken = 0

    def __iter__(self) -> Iterator[EndpointLoad]:
        return self

    def __next__(self) -> EndpointLoad:
        got = next(self._it)
        self.taken += 1
        return got


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=0, max_size=8),
    margin=st.sampled_from([0.5, 0.9, 1.0, 1.2, 3.0]),
    worst_case=st.booleans(),
    tail=st.sampled_from(["mean", "normal"]),
    later=st.floats(min_value=0.0, max_value=2.0),
    **NEW_REQUEST,
)
def test_the_walk_stops_where_a_prediction_per_load_meets_the_slo(
    *,
    endpoints: list[Endpoint],
    margin: float,
    worst_case: bool,
    tail: Literal["mean", "normal"],
    later: float,
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
) -> None:
    """`misses_everywhere` admits exactly when a load's `predict` meets the limits (`_meets`), takes the
    loads up to the first such one and no further, and when none does hands back every load tried (the
    refusal's predictions are theirs)."""
    now = NOW + later
    params = PredictParams(tail=tail, tau=0.05, prefill_overhead=0.05)
    loads = [EndpointLoad(view_of(k, e), now, params) for k, e in enumerate(endpoints)]
    req = new_request(prompt, out, targets, cached, now=now)
    slo = SloPolicy(classes={}, default_class="default")
    admitter = SloFeasibilityAdmitter(SloFeasibilityParams(margin=margin), slo)
    left, itl_ms = time_left(req, now), req.slo.itl_ms
    meets = [admitter._meets(load.predict(req, worst_case=worst_case), left, itl_ms) for load in loads]
    walk = _Counted(loads)
    got = misses_everywhere(walk, req, admitter._limits(left, req.slo.itl_ms), worst_case=worst_case)
    event(f"admitted at load {meets.index(True)}" if any(meets) else f"refused after {len(loads)} loads")
    if any(meets):
        assert got is None
        assert walk.taken == meets.index(True) + 1
    else:
        assert got is not None
        assert len(got.loads) == len(loads)
        assert all(a is b for a, b in zip(got.loads, loads, strict=True))
        assert walk.taken == len(loads)


@settings(max_examples=200, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=0, max_size=8),
    worst_case=st.booleans(),
    tail=st.sampled_from(["mean", "normal"]),
    **NEW_REQUEST,
)
def test_a_refusals_times_are_the_predictions(
    *,
    endpoints: list[Endpoint],
    worst_case: bool,
    tail: Literal["mean", "normal"],
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
) -> None:
    """A walk that misses everywhere keeps each load's `predict` first token and last token, bit for bit,
    in order (a refusal's message reads them), and its loads' waits are the predictions'."""
    params = PredictParams(tail=tail, tau=0.05, prefill_overhead=0.05)
    loads = [EndpointLoad(view_of(k, e), NOW, params) for k, e in enumerate(endpoints)]
    req = new_request(prompt, out, targets, cached)
    preds = [load.predict(req, worst_case=worst_case) for load in loads]
    got = misses_everywhere(iter(loads), req, (-math.inf, None, None), worst_case=worst_case)
    assert got is not None
    assert got.ttfts == [p.ttft_s for p in preds]
    assert got.e2es == [p.e2e_s for p in preds]
    assert [load.wait_s for load in got.loads] == [p.wait_s for p in preds]


_SCALE = st.sampled_from([None, 0.999, 1.0, 1.001, 2.0])


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    at=st.integers(min_value=0, max_value=7),
    scales=st.tuples(_SCALE, _SCALE, _SCALE),
    worst_case=st.booleans(),
    **NEW_REQUEST,
)
def test_the_walk_at_the_limits_of_one_loads_prediction(
    *,
    endpoints: list[Endpoint],
    at: int,
    scales: tuple[float | None, float | None, float | None],
    worst_case: bool,
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
) -> None:
    """Limits at (or a hair either side of) one load's own predicted first token, last token and
    per-token time: the walk stops at the first load whose prediction is within all three, compared as
    `_meets` compares them (equal counts as within)."""
    params = PredictParams(tail="normal", tau=0.05, prefill_overhead=0.05)
    loads = [EndpointLoad(view_of(k, e), NOW, params) for k, e in enumerate(endpoints)]
    req = new_request(prompt, out, targets, cached)
    preds = [load.predict(req, worst_case=worst_case) for load in loads]
    p = preds[at % len(loads)]
    a, b, c = scales
    limits = (
        None if a is None else p.ttft_s * a,
        None if b is None else p.e2e_s * b,
        None if c is None else p.tpot_s * 1000.0 * c,
    )
    meets = [
        (limits[0] is None or q.ttft_s <= limits[0])
        and (limits[1] is None or q.e2e_s <= limits[1])
        and (limits[2] is None or q.tpot_s * 1000.0 <= limits[2])
        for q in preds
    ]
    walk = _Counted(loads)
    got = misses_everywhere(walk, req, limits, worst_case=worst_case)
    assert (got is None) is any(meets)
    assert walk.taken == (meets.index(True) + 1 if any(meets) else len(loads))


@settings(max_examples=200, deadline=None)
@given(steps=_STEPS, stop=st.integers(min_value=0, max_value=6))
def test_each_answers_and_writes_what_load_per_view_does(
    steps: list[tuple[str, int, float]], stop: int
) -> None:
    """`each` on one cache and `load` per view on another, through the same changes (progress reports,
    dispatches, completions, the clock within and past the reuse time, `refs` leaving pending loads),
    each walk stopped after `stop` views: the same numbers handed out and the same entries kept (the views
    after the stop not asked about)."""
    walked, plain = LoadCache(PredictParams()), LoadCache(PredictParams())
    now = 10.0
    views = [_view(i, now) for i in range(6)]
    for what, k, dt in steps:
        now += dt
        candidates = fleet_step(views, what, k, now, (walked, plain))
        got = list(itertools.islice(walked.each(iter(candidates), now), stop))
        want = [plain.load(e, now) for e in candidates[:stop]]
        _same(walked, plain, views, got, want)


def test_each_reads_the_table_again_once_a_full_table_is_emptied() -> None:
    """Past 4,096 entries the cache starts a new table: loads asked after that in the same walk are
    looked up in the new one, as `load` per view looks them up."""
    walked, plain = LoadCache(PredictParams()), LoadCache(PredictParams())
    views = [_view(i, 0.0, cap=2, runs=i % 2) for i in range(4100)]
    for cache in (walked, plain):
        for e in views[4000:]:
            cache.load(e, 1.0)
    got = list(walked.each(views, 1.0 + 0.5 * REUSE_S))
    want = [plain.load(e, 1.0 + 0.5 * REUSE_S) for e in views]
    assert [_numbers(a) for a in got] == [_numbers(b) for b in want]
    _same(walked, plain, views, got, want)


def _view(i: int, now: float, *, cap: int = 4, runs: int | None = None) -> EndpointView:
    """Endpoint `e{i}` with `runs` running requests (by default `i % 4`)."""
    n = i % 4 if runs is None else runs
    return view(f"e{i}", cap=cap, runs=[_run(i + j, now) for j in range(n)])


@st.composite
def _fleet(draw: st.DrawFn) -> tuple[EndpointView, ...]:
    """Endpoints of two models, in any health, some with every seat taken."""
    out = []
    for k, e in enumerate(draw(st.lists(ENDPOINT, min_size=0, max_size=8))):
        v = view_of(k, e)
        out.append(
            _R(
                v,
                models=draw(st.sampled_from([v.models, frozenset({"x"}), v.models | {"x"}])),
                health=draw(st.sampled_from([EndpointHealth.READY, EndpointHealth.UNHEALTHY])),
                max_batch=draw(st.none() | st.integers(1, 24)),
            )
        )
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(views=_fleet(), memo=st.booleans(), columns=st.booleans())
def test_free_seats_from_the_memo_are_those_from_the_columns(
    views: tuple[EndpointView, ...], memo: bool, columns: bool
) -> None:
    """`ReadySeats` from the memo's list (a snapshot with the memo of its views, with or without
    columns), from the columns, or from a list made for the call: the same endpoints, free seats and
    endpoints with a free seat as a walk of the views."""
    model = next(iter(views[0].models)) if views else ModelName("m")
    snap = FleetSnapshot(
        NOW,
        views,
        columns=columns_of(views) if columns else None,
        memo=ViewsMemo.of(views, None) if memo else None,
    )
    seats = ReadySeats(model, snap)
    ready = [e for e in views if model in e.models and e.health is EndpointHealth.READY]
    assert seats.any == bool(ready)
    assert seats.free == sum(max(0, seats_of(e) - len(e.running)) for e in ready)
    assert seats.views() == ready
    assert list(seats.open()) == [e for e in ready if len(e.running) < seats_of(e)]
