"""The in-tree plugins, each through the profile runner as the scheduler uses them."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import (
    EndpointHealth,
)
from gateway.sched.interfaces import Picker
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.ordering.fcfs import FcfsOrdering
from gateway.sched.plugins.placement.least_outstanding import LeastOutstandingScorer, MaxScorePicker
from gateway.sched.plugins.placement.power_of_two import PowerOfTwoParams, PowerOfTwoPicker
from gateway.sched.plugins.placement.round_robin import RoundRobinPicker
from gateway.sched.profile import SchedulerProfile, WeightedScorer
from gateway.sched.registry import BuildContext, PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from tests.unit.sched_builders import request, snapshot, view

T = TypeVar("T")


def place(profile: SchedulerProfile, req: SchedRequest, snap: FleetSnapshot) -> str | None:
    chosen = profile.place(req, snap)
    return None if chosen is None else chosen.id


def least_outstanding_profile(picker: Picker | None = None) -> SchedulerProfile:
    return SchedulerProfile(
        filters=(),
        scorers=(WeightedScorer(LeastOutstandingScorer(), 1.0),),
        picker=picker or MaxScorePicker(),
    )


def build(kind: PluginKind, name: str, params: dict[str, Any] | None = None, seed: int | None = None) -> Any:
    return default_registry().build(kind, name, params, path="test", ctx=BuildContext(seed=seed))


# ----------------------------------------------------------------- round robin
ABC = ("a", "b", "c")


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([("m", ABC)] * 5, ["a", "b", "c", "a", "b"], id="rotates-in-id-order"),
        pytest.param(
            [("m", ABC), ("n", ABC), ("m", ABC), ("n", ABC), ("n", ABC)],
            ["a", "a", "b", "b", "c"],
            id="one-cursor-per-model",
        ),
        pytest.param(
            [("m", ABC), ("m", ("a", "c")), ("m", ABC)], ["a", "c", "a"], id="skips-an-ineligible-one"
        ),
        pytest.param([("m", ABC), ("m", ABC), ("m", ("a",)), ("m", ABC)], ["a", "b", "a", "b"], id="wraps"),
        pytest.param([("m", ("c", "a", "b"))] * 3, ["a", "b", "c"], id="candidate-order-does-not-matter"),
    ],
)
def test_round_robin_rotates_per_model_over_the_candidates(
    steps: list[tuple[str, Sequence[str]]], expected: list[str]
) -> None:
    picker = RoundRobinPicker()
    picks = []
    for model, ids in steps:
        views = [view(i, models=("m", "n")) for i in ids]
        picks.append(picker.pick(request(model=model), [(v, 0.0) for v in views], snapshot(*views)).id)
    assert picks == expected


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        pytest.param(
            [view("a"), view("b", cap=1, inflight=1), view("c")], ["a", "c", "a", "c"], id="full-endpoint"
        ),
        pytest.param(
            [view("a"), view("b", health=EndpointHealth.UNHEALTHY), view("c")],
            ["a", "c", "a", "c"],
            id="unhealthy-endpoint",
        ),
        pytest.param(
            [view("a", models=("x",)), view("b"), view("c")], ["b", "c", "b", "c"], id="other-model-endpoint"
        ),
    ],
)
def test_round_robin_skips_ineligible_endpoints(fleet: list[EndpointView], expected: list[str]) -> None:
    profile = SchedulerProfile(filters=(), scorers=(), picker=build(PluginKind.PICKER, "round-robin"))
    assert [place(profile, request(), snapshot(*fleet)) for _ in expected] == expected


# ----------------------------------------------------------------- least outstanding
@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        pytest.param([view("a", inflight=3), view("b", inflight=1)], "b", id="fewer-in-flight"),
        pytest.param(
            [view("a", inflight=1, waiting=5.0), view("b", inflight=3, waiting=0.0)],
            "b",
            id="engine-waiting-counts",
        ),
        pytest.param(
            [view("a", inflight=2, waiting=None), view("b", inflight=1, waiting=2.0)],
            "a",
            id="no-gauges-counts-in-flight-only",
        ),
        pytest.param([view("b", inflight=2), view("a", inflight=2)], "a", id="tie-goes-to-lowest-id"),
        pytest.param(
            [view("a", inflight=1, waiting=1.0), view("b", inflight=2, waiting=0.0)],
            "a",
            id="equal-outstanding-tie-goes-to-fewer-in-flight",
        ),
        pytest.param(
            [view("a", inflight=0, cap=0), view("b", inflight=7)], "b", id="least-loaded-but-no-room"
        ),
    ],
)
def test_least_outstanding_prefers_fewer_in_flight_plus_engine_waiting(
    fleet: list[EndpointView], expected: str
) -> None:
    assert place(least_outstanding_profile(), request(), snapshot(*fleet)) == expected


@settings(max_examples=100, deadline=None)
@given(
    loads=st.lists(
        st.tuples(st.integers(0, 100), st.none() | st.floats(0.0, 1e6)), min_size=1, max_size=6, unique=True
    )
)
def test_least_outstanding_scores_are_in_range_and_monotone(loads: list[tuple[int, float | None]]) -> None:
    views = [view(f"e{i}", inflight=n, waiting=w) for i, (n, w) in enumerate(loads)]
    got = LeastOutstandingScorer().score(request(), views, snapshot(*views))
    assert len(got) == len(views)  # in candidate order
    scores = dict(zip((v.id for v in views), got, strict=True))
    assert all(0.0 < s <= 1.0 for s in scores.values())
    by_load = sorted(views, key=lambda v: v.outstanding)
    assert [scores[v.id] for v in by_load] == sorted(scores.values(), reverse=True)
    assert got == [1.0 / (1.0 + v.outstanding) for v in views]


# ----------------------------------------------------------------- power of two
def scored_fleet(scores: Sequence[float]) -> list[tuple[EndpointView, float]]:
    return [(view(f"e{i}"), s) for i, s in enumerate(scores)]


def picks(picker: Picker, rounds: int = 40) -> list[str]:
    out: list[str] = []
    for i in range(rounds):
        scored = scored_fleet([(i * 7 + j * 3) % 5 / 4 for j in range(6)])
        out.append(picker.pick(request(), scored, snapshot(*(v for v, _ in scored))).id)
    return out


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(({"seed": 7}, None), ({"seed": 7}, None), id="params-seed"),
        pytest.param(({}, 7), ({}, 7), id="context-seed"),
        pytest.param(({"seed": 7}, None), ({}, 7), id="params-and-context-seed-agree"),
        pytest.param(({"seed": 7}, 99), ({"seed": 7}, 12), id="params-seed-wins-over-context"),
    ],
)
def test_power_of_two_with_a_seed_is_deterministic(
    first: tuple[dict[str, Any], int | None], second: tuple[dict[str, Any], int | None]
) -> None:
    one = build(PluginKind.PICKER, "power-of-two", first[0], seed=first[1])
    two = build(PluginKind.PICKER, "power-of-two", second[0], seed=second[1])
    seq = picks(one)
    assert seq == picks(two)
    assert len(set(seq)) > 1, "it samples; it does not always pick the same endpoint"


class RecordingRandom(random.Random):
    """A seeded Random that remembers the last sample it drew (a fake, not a mock: it really samples)."""

    last_sample: list[Any]

    def sample(self, population: Sequence[T], k: int, *, counts: Iterable[int] | None = None) -> list[T]:
        drawn = super().sample(population, k, counts=counts)
        self.last_sample = list(drawn)
        return drawn


@settings(max_examples=100, deadline=None)
@given(
    scores=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8),
    inflight=st.lists(st.integers(0, 4), min_size=8, max_size=8),
    seed=st.integers(0, 2**32),
    choices=st.integers(1, 3),
)
def test_power_of_two_never_picks_the_worse_of_its_samples(
    scores: list[float], inflight: list[int], seed: int, choices: int
) -> None:
    rng = RecordingRandom(seed)
    picker = PowerOfTwoPicker(PowerOfTwoParams(choices=choices), rng)
    scored = [(view(f"e{i}", inflight=inflight[i]), s) for i, s in enumerate(scores)]
    chosen = picker.pick(request(), scored, snapshot(*(v for v, _ in scored)))
    sample: list[tuple[EndpointView, float]] = rng.last_sample
    assert len(sample) == min(choices, len(scored))
    assert any(chosen is v for v, _ in sample)
    best = max(s for _, s in sample)
    chosen_score = next(s for v, s in sample if v is chosen)
    assert chosen_score == best
    assert chosen.inflight == min(v.inflight for v, s in sample if s == best)


def test_power_of_two_with_choices_covering_the_fleet_is_max_score() -> None:
    picker = PowerOfTwoPicker(PowerOfTwoParams(choices=10), random.Random(1))
    scored = scored_fleet([0.1, 0.9, 0.5])
    assert {picker.pick(request(), scored, snapshot()).id for _ in range(20)} == {"e1"}


# ----------------------------------------------------------------- fcfs
@pytest.mark.parametrize(
    ("a", "b", "relation"),
    [
        pytest.param(1.0, 2.0, "<", id="earlier-first"),
        pytest.param(2.0, 1.0, ">", id="later-second"),
        pytest.param(1.5, 1.5, "==", id="same-arrival-ties-for-the-scheduler-to-break"),
    ],
)
def test_fcfs_key_is_the_arrival_time(a: float, b: float, relation: str) -> None:
    ordering, snap = FcfsOrdering(), snapshot()
    ka, kb = ordering.key(request("a", arrival=a), snap), ordering.key(request("b", arrival=b), snap)
    assert ka == (a,)
    assert {"<": ka < kb, ">": ka > kb, "==": ka == kb}[relation]
