"""The profile runner: eligibility, filters, weighted and clamped scores, and the picker contract."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import (
    EndpointHealth,
    EndpointId,
    ModelName,
)
from gateway.sched.profile import SchedulerProfile, WeightedScorer, eligible
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from tests.unit.sched_builders import request as base_request
from tests.unit.sched_builders import snapshot
from tests.unit.sched_builders import view as base_view

READY = EndpointHealth.READY


def view(eid: str, *, cap: int = 4, **kw: Any) -> EndpointView:
    return base_view(eid, cap=cap, **kw)


def request(rid: str = "r1", model: str = "m") -> SchedRequest:
    return base_request(rid, model)


# ----------------------------------------------------------------- fakes (no mocks)
@dataclasses.dataclass
class FixedScorer:
    values: Mapping[str, float]
    name: str = "fixed"

    def score(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Mapping[EndpointId, float]:
        return {EndpointId(k): v for k, v in self.values.items()}


@dataclasses.dataclass
class InOrderScorer:
    """`FixedScorer`'s values as a sequence in candidate order (a candidate it has none for: 0), a list
    or a tuple; `extra` values more than there are candidates (a broken scorer)."""

    values: Mapping[str, float]
    name: str = "in-order"
    as_tuple: bool = False
    extra: int = 0

    def score(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[float]:
        out = [self.values.get(e.id, 0.0) for e in candidates] + [0.5] * self.extra
        return tuple(out) if self.as_tuple else out


@dataclasses.dataclass
class KeepFilter:
    """Keeps the candidates whose id is in `keep`; records what it was given."""

    keep: frozenset[str]
    name: str = "keep"
    seen: list[list[str]] = dataclasses.field(default_factory=list)

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        self.seen.append([e.id for e in candidates])
        return [e for e in candidates if e.id in self.keep]


@dataclasses.dataclass
class RecordingPicker:
    """Highest score, ties by id; records the scored list it was called with."""

    name: str = "recording"
    calls: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def pick(
        self, req: SchedRequest, scored: Sequence[tuple[EndpointView, float]], snap: FleetSnapshot
    ) -> EndpointView:
        self.calls.append({e.id: s for e, s in scored})
        return min(scored, key=lambda es: (-es[1], es[0].id))[0]


@dataclasses.dataclass
class RoguePicker:
    """Returns something that is not one of the candidates it was given."""

    returns: EndpointView
    name: str = "rogue"

    def pick(
        self, req: SchedRequest, scored: Sequence[tuple[EndpointView, float]], snap: FleetSnapshot
    ) -> EndpointView:
        return self.returns


# ----------------------------------------------------------------- eligibility
@pytest.mark.parametrize(
    ("endpoint", "is_eligible"),
    [
        pytest.param(view("e"), True, id="ready-serving-with-room"),
        pytest.param(view("e", cap=2, inflight=1), True, id="one-slot-left"),
        pytest.param(view("e", cap=2, inflight=2), False, id="at-cap"),
        pytest.param(view("e", cap=2, inflight=3), False, id="over-cap"),
        pytest.param(view("e", health=EndpointHealth.STARTING), False, id="starting"),
        pytest.param(view("e", health=EndpointHealth.UNHEALTHY), False, id="unhealthy"),
        pytest.param(view("e", models=("other",)), False, id="other-model"),
        pytest.param(view("e", models=()), False, id="models-not-discovered"),
        pytest.param(view("e", models=("other", "m")), True, id="one-of-several-models"),
    ],
)
def test_only_ready_endpoints_serving_the_model_with_room_are_eligible(
    endpoint: EndpointView, is_eligible: bool
) -> None:
    snap = snapshot(endpoint)
    assert eligible(request(), snap) == ([endpoint] if is_eligible else [])
    picker = RecordingPicker()
    placed = SchedulerProfile(filters=(), scorers=(), picker=picker).place(request(), snap)
    assert placed is (endpoint if is_eligible else None)
    assert len(picker.calls) == (1 if is_eligible else 0), "the picker is never called with nothing"


@pytest.mark.parametrize(
    ("pinned", "expected"),
    [
        pytest.param("b", ["b"], id="its-endpoint-only"),
        pytest.param("full", [], id="its-endpoint-has-no-room"),
        pytest.param("other-model", [], id="its-endpoint-no-longer-serves-the-model"),
        pytest.param("gone", [], id="its-endpoint-left"),
        pytest.param(None, ["a", "b"], id="not-pinned"),
    ],
)
def test_a_pinned_request_is_eligible_only_on_its_endpoint(pinned: str | None, expected: list[str]) -> None:
    snap = snapshot(view("a"), view("b"), view("full", cap=0), view("other-model", models=("x",)))
    req = dataclasses.replace(request(), pinned=None if pinned is None else EndpointId(pinned))
    assert [e.id for e in eligible(req, snap)] == expected


def test_filters_see_only_eligible_candidates_in_order_of_the_pipeline() -> None:
    ok, full, sick = (
        view("ok"),
        view("full", cap=1, inflight=1),
        view("sick", health=EndpointHealth.UNHEALTHY),
    )
    other, dropped = view("other"), view("dropped")
    first, second = KeepFilter(frozenset({"ok", "other"})), KeepFilter(frozenset({"ok"}))
    profile = SchedulerProfile(filters=(first, second), scorers=(), picker=RecordingPicker())
    assert profile.place(request(), snapshot(ok, full, sick, other, dropped)) is ok
    assert first.seen == [["ok", "other", "dropped"]]
    assert second.seen == [["ok", "other"]]


@pytest.mark.parametrize(
    "keeps",
    [
        pytest.param([frozenset[str]()], id="only-filter-empties"),
        pytest.param([frozenset({"a"}), frozenset[str]()], id="last-filter-empties"),
        pytest.param([frozenset[str](), frozenset({"a", "b"})], id="first-filter-empties"),
    ],
)
def test_a_filter_that_leaves_nothing_means_none(keeps: list[frozenset[str]]) -> None:
    filters = [KeepFilter(k) for k in keeps]
    picker = RecordingPicker()
    profile = SchedulerProfile(filters=tuple(filters), scorers=(), picker=picker)
    assert profile.place(request(), snapshot(view("a"), view("b"))) is None
    assert picker.calls == []
    # Once the candidates are gone no later filter runs.
    first_empty = next(i for i, k in enumerate(keeps) if not k)
    assert all(f.seen == [] for f in filters[first_empty + 1 :])


@dataclasses.dataclass
class TiersFilter:
    """Ranks the candidates into the given tiers of ids (a TieredFilter)."""

    ranks: list[frozenset[str]]
    name: str = "tiers"

    def tiers(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[Sequence[EndpointView]]:
        return [[e for e in candidates if e.id in r] for r in self.ranks]

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        return next((t for t in self.tiers(req, candidates, snap) if t), [])


@pytest.mark.parametrize(
    ("ranks", "later_keeps", "placed", "later_saw"),
    [
        pytest.param(["a", "bc"], "abc", "a", [["a"]], id="first-tier-survives"),
        pytest.param(["a", "bc"], "c", "c", [["a"], ["b", "c"]], id="next-tier-when-first-is-dropped"),
        pytest.param(["", "bc"], "abc", "b", [["b", "c"]], id="empty-tier-skipped"),
        pytest.param(["a", "b"], "c", None, [["a"], ["b"]], id="no-tier-survives"),
        pytest.param([], "abc", None, [], id="no-tiers"),
    ],
)
def test_a_tiered_filter_passes_each_tier_through_the_later_filters_in_turn(
    ranks: list[str], later_keeps: str, placed: str | None, later_saw: list[list[str]]
) -> None:
    tiers = TiersFilter([frozenset(r) for r in ranks])
    later = KeepFilter(frozenset(later_keeps))
    profile = SchedulerProfile(filters=(tiers, later), scorers=(), picker=RecordingPicker())
    got = profile.place(request(), snapshot(view("a"), view("b"), view("c")))
    assert (None if got is None else got.id) == placed
    assert later.seen == later_saw


def test_filters_before_a_tiered_filter_run_once() -> None:
    first = KeepFilter(frozenset("abc"))
    profile = SchedulerProfile(
        filters=(first, TiersFilter([frozenset("a"), frozenset("b")]), KeepFilter(frozenset("b"))),
        scorers=(),
        picker=RecordingPicker(),
    )
    got = profile.place(request(), snapshot(view("a"), view("b"), view("c")))
    assert got is not None
    assert got.id == "b"
    assert first.seen == [["a", "b", "c"]]


@dataclasses.dataclass
class ScopeFilter(KeepFilter):
    """Keeps `keep` also as its scope (a ScopedFilter); records the endpoints its scope was given."""

    scoped: list[list[str]] = dataclasses.field(default_factory=list)

    def scope(
        self, req: SchedRequest, serving: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        self.scoped.append([e.id for e in serving])
        return [e for e in serving if e.id in self.keep]


def test_scope_cuts_only_the_requests_model_to_what_every_scoped_filter_allows() -> None:
    a, b = ScopeFilter(frozenset("abc")), ScopeFilter(frozenset("bcx"))
    profile = SchedulerProfile(filters=(KeepFilter(frozenset()), a, b), scorers=(), picker=RecordingPicker())
    full = view("a", cap=1, inflight=1)  # full and starting: still in scope (admission judges it)
    starting = view("c", health=EndpointHealth.STARTING)
    other = view("x", models=("other",))
    snap = snapshot(full, view("b"), starting, view("d"), other)
    got = profile.scope(request(), snap)
    assert [e.id for e in got.endpoints] == ["b", "c", "x"]  # the other model's endpoint is left alone
    assert a.scoped == [["a", "b", "c", "d"]]
    assert b.scoped == [["a", "b", "c"]]  # each scope sees what the one before it kept
    assert got.now == snap.now


def test_without_scoped_filters_the_snapshot_is_unchanged() -> None:
    profile = SchedulerProfile(filters=(KeepFilter(frozenset()),), scorers=(), picker=RecordingPicker())
    snap = snapshot(view("a"), view("b"))
    assert profile.scope(request(), snap) is snap


# ----------------------------------------------------------------- scores
@pytest.mark.parametrize(
    ("raw", "clamped"),
    [
        pytest.param(0.25, 0.25, id="in-range"),
        pytest.param(0.0, 0.0, id="zero"),
        pytest.param(1.0, 1.0, id="one"),
        pytest.param(-0.5, 0.0, id="negative"),
        pytest.param(1.7, 1.0, id="above-one"),
        pytest.param(math.nan, 0.0, id="nan"),
        pytest.param(math.inf, 1.0, id="inf"),
        pytest.param(-math.inf, 0.0, id="minus-inf"),
    ],
)
@pytest.mark.parametrize("weight", [1.0, 2.5], ids=["w1", "w2.5"])
def test_scores_are_clamped_then_weighted(raw: float, clamped: float, weight: float) -> None:
    picker = RecordingPicker()
    profile = SchedulerProfile(
        filters=(), scorers=(WeightedScorer(FixedScorer({"a": raw}), weight),), picker=picker
    )
    profile.place(request(), snapshot(view("a")))
    assert picker.calls == [{"a": pytest.approx(weight * clamped)}]


def test_weights_combine_scorers_and_decide_the_pick() -> None:
    picker = RecordingPicker()
    prefers_a = WeightedScorer(FixedScorer({"a": 1.0, "b": 0.0}, name="likes-a"), 1.0)
    prefers_b = WeightedScorer(FixedScorer({"a": 0.0, "b": 0.5}, name="likes-b"), 3.0)
    profile = SchedulerProfile(filters=(), scorers=(prefers_a, prefers_b), picker=picker)
    chosen = profile.place(request(), snapshot(view("a"), view("b")))
    assert picker.calls == [{"a": 1.0, "b": 1.5}]
    assert chosen is not None
    assert chosen.id == "b"


def test_missing_scores_count_zero_and_unknown_ids_are_ignored() -> None:
    picker = RecordingPicker()
    scorer = WeightedScorer(FixedScorer({"b": 0.5, "not-a-candidate": 1.0, "full": 1.0}), 1.0)
    profile = SchedulerProfile(filters=(), scorers=(scorer,), picker=picker)
    profile.place(request(), snapshot(view("a"), view("b"), view("full", cap=1, inflight=1)))
    assert picker.calls == [{"a": 0.0, "b": 0.5}]


@pytest.mark.parametrize(
    "returned",
    [
        pytest.param(view("stranger"), id="not-in-snapshot"),
        pytest.param(view("full", cap=1, inflight=1), id="ineligible-endpoint-of-snapshot"),
        pytest.param(view("filtered-out"), id="removed-by-a-filter"),
        pytest.param(view("a"), id="equal-copy-of-a-candidate"),
    ],
)
def test_a_picker_returning_a_non_candidate_raises(returned: EndpointView) -> None:
    snap = snapshot(view("a"), view("full", cap=1, inflight=1), view("filtered-out"))
    profile = SchedulerProfile(
        filters=(KeepFilter(frozenset({"a"})),), scorers=(), picker=RoguePicker(returned)
    )
    with pytest.raises(RuntimeError, match="picker 'rogue' returned an endpoint that was not a candidate"):
        profile.place(request(), snap)


_any_float = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=100, deadline=None)
@given(
    scores=st.lists(st.dictionaries(st.sampled_from("abcd"), _any_float, max_size=4), min_size=1, max_size=3),
    weights=st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=3, max_size=3),
)
def test_weighted_totals_stay_within_zero_and_the_weight_sum(
    scores: list[dict[str, float]], weights: list[float]
) -> None:
    picker = RecordingPicker()
    scorers = tuple(WeightedScorer(FixedScorer(s), w) for s, w in zip(scores, weights, strict=False))
    profile = SchedulerProfile(filters=(), scorers=scorers, picker=picker)
    chosen = profile.place(request(), snapshot(view("a"), view("b"), view("c")))
    assert chosen is not None
    (totals,) = picker.calls
    upper = sum(ws.weight for ws in scorers)
    assert set(totals) == {"a", "b", "c"}
    assert all(0.0 <= t <= upper + 1e-9 for t in totals.values()), totals


def _clamped(v: float) -> float:
    return 0.0 if math.isnan(v) or v < 0.0 else min(v, 1.0)


@settings(max_examples=200, deadline=None)
@given(
    scores=st.lists(
        st.dictionaries(st.sampled_from("abcde"), _any_float | st.floats(0.0, 1.0), max_size=5),
        min_size=0,
        max_size=3,
    ),
    weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5]), min_size=3, max_size=3),
    kinds=st.lists(st.sampled_from([0, 1, 2]), min_size=3, max_size=3),
)
def test_totals_equal_clamping_each_value_then_summing_in_scorer_order(
    scores: list[dict[str, float]], weights: list[float], kinds: list[int]
) -> None:
    # The runner checks a scorer's values together (in C) and clamps one by one only when one is out
    # of range: the totals must be exactly those of clamping every value, weighting, and adding them
    # up scorer by scorer from 0, whether a scorer answers with a mapping, a list or a tuple.
    picker = RecordingPicker()
    makers = (FixedScorer, InOrderScorer, lambda v: InOrderScorer(v, as_tuple=True))
    scorers = tuple(WeightedScorer(makers[k](s), w) for s, w, k in zip(scores, weights, kinds, strict=False))
    profile = SchedulerProfile(filters=(), scorers=scorers, picker=picker)
    ids = ["a", "b", "c", "d"]
    profile.place(request(), snapshot(*(view(i) for i in ids)))
    expected = dict.fromkeys(ids, 0.0)
    for values, weight in zip(scores, weights, strict=False):
        for i in ids:
            expected[i] += weight * _clamped(values.get(i, 0.0))
    assert picker.calls == [expected]


@pytest.mark.parametrize("extra", [1, -1], ids=["one-too-many", "one-too-few"])
def test_a_scorer_whose_sequence_is_not_one_score_per_candidate_raises(extra: int) -> None:
    scorer = InOrderScorer({"a": 1.0}, extra=extra) if extra > 0 else _Short()
    profile = SchedulerProfile(filters=(), scorers=(WeightedScorer(scorer, 1.0),), picker=RecordingPicker())
    with pytest.raises(RuntimeError, match=r"gave [0-9]+ scores for 2 candidates"):
        profile.place(request(), snapshot(view("a"), view("b")))


class _Short:
    name = "short"

    def score(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[float]:
        return [1.0] * (len(candidates) - 1)


@dataclasses.dataclass
class PerRequestScope(KeepFilter):
    """A scope that keeps, per request, the endpoints its table names (all of them when it has none)."""

    parts: dict[str, frozenset[str]] = dataclasses.field(default_factory=dict)

    def scope(
        self, req: SchedRequest, serving: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        part = self.parts.get(req.id)
        return serving if part is None else [e for e in serving if e.id in part]


@settings(max_examples=200, deadline=None)
@given(
    asks=st.lists(
        st.tuples(
            st.sampled_from(("m", "n")),
            st.one_of(st.none(), st.frozensets(st.sampled_from("abcd"))),
            st.booleans(),  # a new snapshot of the same fleet before it
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_scoped_part_is_one_snapshot_per_snapshot_model_and_part(
    asks: list[tuple[str, frozenset[str] | None, bool]],
) -> None:
    """The same cut as computed afresh; the same object when the snapshot, model and part kept are."""
    filt = PerRequestScope(frozenset())
    profile = SchedulerProfile(filters=(filt,), scorers=(), picker=RecordingPicker())
    views = (view("a"), view("b", models=("m", "n")), view("c", models=("n",)), view("d"))
    snap = snapshot(*views)
    seen: dict[tuple[str, frozenset[str]], FleetSnapshot] = {}  # this snapshot's parts
    for i, (model, part, fresh) in enumerate(asks):
        if fresh:
            snap = snapshot(*views)
            seen.clear()
        rid = f"r{i}"
        if part is not None:
            filt.parts[rid] = part
        got = profile.scope(request(rid, model), snap)
        serving = [e.id for e in views if ModelName(model) in e.models]
        kept = serving if part is None else [e for e in serving if e in part]
        want = [e.id for e in views if ModelName(model) not in e.models or e.id in kept]
        assert [e.id for e in got.endpoints] == want
        key = (model, frozenset(kept))
        if len(kept) == len(serving):
            assert got is snap
        elif key in seen:
            assert got is seen[key]
        seen[key] = got
