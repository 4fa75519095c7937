"""The overflow guard's shortlist (`OverflowGuardParams.shortlist`): it keeps what the guard without one
keeps among the idle candidates and the busy ones judged `shortlist` at a time, fewest running requests
per seat first, up to the first of those where one keeps the request's targets (or, best effort, where it
harms no one), and the whole answer when there is none; over columns the same as the plain way while the
fleet changes (hypothesis: random fleets, requests with and without targets, cached prefixes and best
effort)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import EndpointId
from gateway.sched.columns import columns_of
from gateway.sched.plugins.placement.overflow_guard import (
    OverflowGuardFilter,
    OverflowGuardParams,
    shortlisted,
)
from gateway.sched.predict import seats_of
from gateway.sched.prefix import PrefixHits
from gateway.sched.profile import eligible
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot
from tests.unit.fleet_steps import ENDPOINT, NOW, STEP, Endpoint, advance, view_of
from tests.unit.slo_fixtures import req

_targets = st.tuples(
    st.one_of(st.none(), st.floats(min_value=10.0, max_value=2000.0)),
    st.one_of(st.none(), st.floats(min_value=100.0, max_value=20000.0)),
    st.one_of(st.none(), st.floats(min_value=5.0, max_value=60.0)),
)
_cached = st.dictionaries(st.integers(min_value=0, max_value=7), st.integers(min_value=1, max_value=3000))


def _request(  # noqa: PLR0917 (a test helper)
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
    best_effort: bool,
    now: float = NOW,
) -> SchedRequest:
    ttft_ms, e2e_ms, itl_ms = targets
    r = req(
        "new",
        arrival=now - 0.1,
        prompt=prompt,
        out=out,
        ttft_ms=ttft_ms,
        e2e_ms=e2e_ms,
        itl_ms=itl_ms,
        best_effort=best_effort,
    )
    return dataclasses.replace(r, cached=PrefixHits({EndpointId(f"e{k:02d}"): t for k, t in cached.items()}))


def _guard(shortlist: int, least: int = 1) -> OverflowGuardFilter:
    guard = OverflowGuardFilter(
        OverflowGuardParams(worst_case=False, prefill_overhead=0.05, shortlist=shortlist)
    )
    guard._fleet.least = least
    return guard


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=400.0),
    targets=_targets,
    cached=_cached,
    best_effort=st.booleans(),
    size=st.integers(min_value=1, max_value=4),
)
def test_a_shortlist_keeps_what_the_whole_guard_keeps_on_it_or_the_whole_answer(
    *,
    endpoints: list[Endpoint],
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
    best_effort: bool,
    size: int,
) -> None:
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    r = _request(prompt, out, targets, cached, best_effort)
    snap = FleetSnapshot(now=NOW, endpoints=views, columns=columns_of(views))
    cands = eligible(r, snap)
    harmless, meeting, _ = _guard(0)._judge(r, cands, snap)
    whole = [v.id for v in _guard(0).filter(r, cands, snap)]
    split = shortlisted(r, cands, size)
    busy = [v for v in cands if v.running or v.id in r.cached]
    if split is None:
        assert len(busy) <= size
        expected = whole
    else:
        # the idle candidates, then the busy ones `size` at a time, fewest running per seat first, up to
        # the first `size` where one keeps the request's targets (best effort: where it harms no one)
        idle, order = split
        assert order == sorted(busy, key=lambda v: (len(v.running) / seats_of(v), v.id))
        assert idle == [v for v in cands if v not in busy]
        answer = {v.id for v in (harmless if best_effort else meeting)}
        judged = {v.id for v in idle}
        for k in range(0, len(order), size):
            judged |= {v.id for v in order[k : k + size]}
            if answer & judged:
                break
        expected = [v for v in whole if v in judged] if answer & judged else whole
    assert [v.id for v in _guard(size).filter(r, cands, snap)] == expected
    cols = snap.columns
    assert cols is not None
    mask = _guard(size).filter_columns(r, cols, cols.eligible(r.model), snap)
    assert [v.id for v, m in zip(views, mask.tolist(), strict=True) if m] == expected


@settings(max_examples=150, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    steps=st.lists(STEP, min_size=1, max_size=12),
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=400.0),
    targets=_targets,
    cached=_cached,
    best_effort=st.booleans(),
    size=st.integers(min_value=1, max_value=4),
    least=st.sampled_from((1, 17)),
    plain_first=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_a_shortlisted_guard_over_columns_keeps_what_its_plain_form_keeps_as_the_fleet_changes(
    *,
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int]],
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
    best_effort: bool,
    size: int,
    least: int,
    plain_first: list[bool],
) -> None:
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    cols = columns_of(views)
    guard = _guard(size, least)  # (least 1: over the rows however few are busy; 17: one by one)
    r = _request(prompt, out, targets, cached, best_effort)
    now = NOW
    for serial, ((dt_ms, at, what), first) in enumerate(zip(steps, plain_first, strict=False)):
        views, cols, now = advance(views, cols, now + dt_ms / 1000.0, at=at, what=what, serial=serial)
        s = FleetSnapshot(now=now, endpoints=views, columns=cols)
        got: dict[bool, list[EndpointId]] = {}
        for plain_now in (first, not first):  # (both forms share the guard's load cache)
            if plain_now:
                got[True] = [v.id for v in guard.filter(r, eligible(r, s), s)]
            else:
                mask = guard.filter_columns(r, cols, cols.eligible(r.model), s)
                got[False] = [v.id for v, m in zip(views, mask.tolist(), strict=True) if m]
        assert got[True] == got[False]
        assert np.count_nonzero(cols.eligible(r.model)) >= len(got[True])
