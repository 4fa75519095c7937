"""Placement over columns chooses what the plain path chooses (hypothesis: random fleets of endpoints with
their in-flight counts, caps, health, models and engine gauges; scorers with weights, out-of-range and
NaN values; every change the fleet makes to its views carried into the columns by an update), and the
scheduler takes the columnar path only for profiles whose every plugin has one."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.clock import FakeClock
from gateway.core.types import (
    SLO,
    ApiKind,
    EndpointHealth,
    EndpointId,
    EngineKind,
    InstanceClass,
    ModelName,
    RequestId,
)
from gateway.sched.columns import columns_of, updated
from gateway.sched.decisions import Dispatch
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.placement.least_outstanding import LeastOutstandingScorer, MaxScorePicker
from gateway.sched.plugins.placement.prefix_holders import PrefixHoldersFilter, PrefixHoldersParams
from gateway.sched.prefix import PrefixHits
from gateway.sched.profile import COLUMNS_FROM, Policy, SchedulerProfile, WeightedScorer
from gateway.sched.registry import PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetColumns, FleetSnapshot
from gateway.sched.types import EndpointSpec, QueueLimits
from tests.unit.sched_builders import view
from tests.unit.slo_fixtures import COEF

HEALTH = (EndpointHealth.READY, EndpointHealth.READY, EndpointHealth.UNHEALTHY, EndpointHealth.STARTING)


class Skewed:
    """A columnar scorer that breaks the contract on purpose: values past [0, 1] and NaN, by endpoint."""

    name = "skewed"

    def __init__(self, values: dict[str, float]) -> None:
        self.values = values

    def score(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> list[float]:
        return [self.values.get(e.id, 0.5) for e in candidates]

    def score_columns(
        self, req: SchedRequest, cols: FleetColumns, snap: FleetSnapshot
    ) -> npt.NDArray[np.float64]:
        return np.array([self.values.get(e.id, 0.5) for e in cols.endpoints], dtype=np.float64)


endpoint: st.SearchStrategy[dict[str, object]] = st.builds(
    dict,
    inflight=st.integers(0, 6),
    cap=st.integers(1, 6),
    health=st.sampled_from(HEALTH),
    models=st.sampled_from((("m",), ("m", "n"), ("n",))),
    waiting=st.sampled_from((None, 0.0, 1.0, 2.5, math.nan)),
    cls=st.sampled_from(tuple(InstanceClass)),
    perf=st.sampled_from((None, COEF)),
)


def make(i: int, e: dict[str, object]) -> EndpointView:
    v = view(
        f"e{(i * 7) % 10}{i}",  # ids not in fleet order: the id tie-break is tested
        models=e["models"],  # type: ignore[arg-type]
        health=e["health"],  # type: ignore[arg-type]
        cap=e["cap"],  # type: ignore[arg-type]
        inflight=e["inflight"],  # type: ignore[arg-type]
    )
    return dataclasses.replace(
        v,
        engine_waiting=e["waiting"],  # type: ignore[arg-type]
        instance_class=e.get("cls", InstanceClass.MIXED),  # type: ignore[arg-type]
        estimates=None if e.get("perf") is None else EndpointEstimates(perf=e["perf"]),  # type: ignore[arg-type]
    )


def request(model: str = "m") -> SchedRequest:
    return SchedRequest(
        id=RequestId("r"),
        model=ModelName(model),
        api=ApiKind.CHAT,
        arrival=0.0,
        slo=SLO(),
        prompt_tokens=10,
        max_tokens=None,
        stream=False,
    )


@settings(max_examples=300, deadline=None)
@given(
    fleet=st.lists(endpoint, min_size=1, max_size=12),
    changes=st.lists(st.tuples(st.integers(0, 11), endpoint), max_size=6),
    weights=st.lists(st.sampled_from((0.0, 0.5, 1.0, 2.0)), min_size=1, max_size=2),
    skew=st.dictionaries(st.sampled_from([f"e{(i * 7) % 10}{i}" for i in range(12)]),
                         st.sampled_from((-1.0, 0.25, 0.75, 3.0, math.nan)), max_size=4),
    model=st.sampled_from(("m", "n", "absent")),
)  # fmt: skip
def test_placement_over_columns_chooses_what_the_plain_path_chooses(
    fleet: list[dict[str, object]],
    changes: list[tuple[int, dict[str, object]]],
    weights: list[float],
    skew: dict[str, float],
    model: str,
) -> None:
    scorers = [WeightedScorer(LeastOutstandingScorer(), weights[0])]
    if len(weights) > 1:
        scorers.append(WeightedScorer(Skewed(skew), weights[1]))
    profile = SchedulerProfile(filters=(), scorers=tuple(scorers), picker=MaxScorePicker(), columns_from=0)
    assert profile.columnar
    views = tuple(make(i, e) for i, e in enumerate(fleet))
    cols = columns_of(views)
    # the fleet's updates: some endpoints replaced in place (the views' order and ids stay)
    for at, e in changes:
        i = at % len(views)
        entries = list(views)
        entries[i] = dataclasses.replace(make(i, e), id=views[i].id)
        views = tuple(entries)
        cols = updated(cols, views, {i})
    whole = columns_of(views)
    for name in ("inflight", "cap", "ready", "waiting", "id_rank", "busy", "seats", "coef"):
        assert np.array_equal(getattr(cols, name), getattr(whole, name), equal_nan=name == "waiting")
    assert {m: a.tolist() for m, a in cols.members.items()} == {
        m: a.tolist() for m, a in whole.members.items()
    }
    assert {c: a.tolist() for c, a in cols.classes.items()} == {
        c: a.tolist() for c, a in whole.classes.items()
    }
    req = request(model)
    plain = profile.place(req, FleetSnapshot(now=0.0, endpoints=views))
    columnar = profile.place(req, FleetSnapshot(now=0.0, endpoints=views, columns=cols))
    assert plain is columnar
    cut = FleetSnapshot(now=0.0, endpoints=views[1:], columns=cols)  # columns of other views: not used
    assert profile.place(req, cut) is profile.place(req, FleetSnapshot(now=0.0, endpoints=views[1:]))


def test_a_profile_with_a_plugin_without_a_columnar_form_places_the_plain_way() -> None:
    reg = default_registry()
    rr = SchedulerProfile(
        filters=(), scorers=(), picker=reg.build(PluginKind.PICKER, "round-robin", None, path="p")
    )
    assert not rr.columnar
    default = SchedulerProfile(
        filters=(),
        scorers=(WeightedScorer(reg.build(PluginKind.SCORER, "least-outstanding", None, path="s"), 1.0),),
        picker=reg.build(PluginKind.PICKER, "max-score", None, path="p"),
    )
    assert default.columnar


def test_a_large_fleet_is_placed_over_columns_as_the_small_one_is() -> None:
    """The scheduler builds columns for a fleet of COLUMNS_FROM endpoints and more, and the choices made
    on them (dispatches and completions updating the columns) are least outstanding's."""
    reg = default_registry()
    pol = Policy(
        name="default",
        ordering=reg.build(PluginKind.ORDERING, "fcfs", None, path="o"),
        profile=SchedulerProfile(
            filters=(),
            scorers=(WeightedScorer(reg.build(PluginKind.SCORER, "least-outstanding", None, path="s"), 1.0),),
            picker=reg.build(PluginKind.PICKER, "max-score", None, path="p"),
        ),
    )
    sched = Scheduler(pol, FakeClock(), QueueLimits())
    n = COLUMNS_FROM
    specs = [
        EndpointSpec(
            EndpointId(f"e{i:04d}"), f"http://e{i}", EngineKind.VLLM, frozenset({ModelName("m")}), cap=2
        )
        for i in range(n)
    ]
    sched.sync_endpoints(specs)
    for s in specs:
        sched.set_health(s.id, EndpointHealth.READY)
    assert sched.snapshot().columns is not None
    placed = []
    for k in range(2 * n):
        d = sched.submit(dataclasses.replace(request(), id=RequestId(f"r{k}")))
        assert isinstance(d, Dispatch)
        placed.append(d.endpoint.id)
    # each endpoint once (the fewest in flight, ties by id), then each again
    assert placed == [s.id for s in specs] * 2
    sched.complete(RequestId("r5"))
    d = sched.submit(dataclasses.replace(request(), id=RequestId("again")))
    assert isinstance(d, Dispatch)
    assert d.endpoint.id == specs[5].id


@settings(max_examples=200, deadline=None)
@given(
    fleet=st.lists(endpoint, min_size=1, max_size=10),
    cached=st.dictionaries(st.integers(0, 9), st.sampled_from((16, 512, 4096)), max_size=4),
    prompt=st.sampled_from((10, 600, 5000)),
)
def test_prefix_holders_over_columns_chooses_what_the_plain_path_chooses(
    fleet: list[dict[str, object]], cached: dict[int, int], prompt: int
) -> None:
    """The default policy's filter has a columnar form: a profile with it still places over columns, and
    chooses what the plain path does, with and without cached prefixes."""
    holders = PrefixHoldersFilter(PrefixHoldersParams())
    scorers = (WeightedScorer(LeastOutstandingScorer(), 1.0),)
    profile = SchedulerProfile(filters=(holders,), scorers=scorers, picker=MaxScorePicker(), columns_from=0)
    assert profile.columnar
    views = tuple(make(i, e) for i, e in enumerate(fleet))
    hits = PrefixHits({views[i].id: min(t, prompt) for i, t in cached.items() if i < len(views)})
    req = dataclasses.replace(request(), prompt_tokens=prompt, cached=hits)
    plain = profile.place(req, FleetSnapshot(now=0.0, endpoints=views))
    columnar = profile.place(req, FleetSnapshot(now=0.0, endpoints=views, columns=columns_of(views)))
    assert plain is columnar


def test_a_pinned_request_is_placed_on_its_endpoint_only_over_columns_too() -> None:
    holders = PrefixHoldersFilter(PrefixHoldersParams())
    scorers = (WeightedScorer(LeastOutstandingScorer(), 1.0),)
    profile = SchedulerProfile(filters=(holders,), scorers=scorers, picker=MaxScorePicker(), columns_from=0)
    views = tuple(make(i, {**e, "inflight": i}) for i, e in enumerate([_READY] * 4))
    snap = FleetSnapshot(now=0.0, endpoints=views, columns=columns_of(views))
    assert profile.place(request(), snap) is views[0]  # the least loaded
    pinned = dataclasses.replace(request(), pinned=views[2].id)
    assert profile.place(pinned, snap) is views[2]
    assert profile.place(pinned, FleetSnapshot(now=0.0, endpoints=views)) is views[2]


_READY: dict[str, object] = {
    "inflight": 0,
    "cap": 8,
    "health": EndpointHealth.READY,
    "models": ("m",),
    "waiting": 0.0,
}
