"""What the evictor learns of the traffic: the demand tracker (shares of recent dispatches, expected output),
the expected place of a model's next request, and the eviction plans the state machine reports."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.core.types import ModelName
from gateway.lifecycle.demand import DemandTracker
from gateway.lifecycle.instances import (
    Demand,
    DeviceSpec,
    EvictionDecision,
    InstanceState,
    JoinEndpoint,
    LeaveEndpoint,
    Lifecycle,
    LifecycleSettings,
    ModelSpec,
    NodeSpec,
    StartInstance,
)
from gateway.sched.plugins.eviction.cace import CaceEvictor, CaceParams
from gateway.sched.plugins.eviction.lru import LruEvictor
from tests.unit.sched_builders import request

GIB = 1 << 30
A, B, C = ModelName("a"), ModelName("b"), ModelName("c")


@pytest.mark.parametrize(
    ("demand", "model", "expected"),
    [
        pytest.param(Demand(window=(C, B, B)), B, 1.0, id="queued-first-place"),
        pytest.param(Demand(window=(C,), recent_share={A: 0.25}), A, 1 + 3.0, id="predicted-past-the-queue"),
        pytest.param(Demand(recent_share={A: 1.0}), A, 0.0, id="all-of-the-traffic-is-next"),
        pytest.param(Demand(window=(C,), recent_share={B: 0.5}), A, None, id="unknown"),
        pytest.param(Demand(window=(C, C, A), recent_share={A: 0.5}), A, 2 + 1.0, id="beyond-the-window"),
    ],
)
def test_next_position(demand: Demand, model: ModelName, expected: float | None) -> None:
    assert demand.next_position(model, window=2) == expected


def test_tracker_shares_slide_and_output_is_averaged() -> None:
    t = DemandTracker(history=4, output_alpha=0.5)
    for m in (A, A, B, C):
        t.dispatched(m, 100)
    assert t.shares() == {A: 0.5, B: 0.25, C: 0.25}
    t.dispatched(C, 300)
    t.dispatched(C, None)  # no length known: counted, not averaged
    assert t.shares() == {B: 0.25, C: 0.75}  # both of a's dispatches slid out
    assert t.expected_output() == {A: 100.0, B: 100.0, C: 200.0}
    d = t.demand((A,))
    assert d.window == (A,)
    assert d.recent_share == t.shares()
    with pytest.raises(ValueError, match="history must be"):
        DemandTracker(history=0)


def test_a_resumed_run_is_not_counted_again() -> None:
    t = DemandTracker(history=8)
    a = dataclasses.replace(request("r1", A), max_tokens=50, predicted_output_tokens=40.0)
    b = dataclasses.replace(request("r2", B), max_tokens=50)
    t.placed(a)
    t.placed(b)
    for n in (1, 2):  # preempted twice, resumed twice: still one request for a
        t.placed(dataclasses.replace(a, preemptions=n, produced_tokens=10 * n))
    assert t.shares() == {A: 0.5, B: 0.5}
    assert t.expected_output() == {A: 40.0, B: 50.0}  # b had no prediction: its max_tokens


def _lifecycle(evictor: CaceEvictor | LruEvictor, demand: Demand) -> tuple[Lifecycle, str, str]:
    models = {m: ModelSpec(m, 10 * GIB, load_s=5) for m in (A, B, C)}
    lc = Lifecycle(
        models=models,
        nodes=[NodeSpec("n1", (DeviceSpec("gpu0", 20 * GIB),))],
        evictor=evictor,
        settings=LifecycleSettings(churn_guard_s=0),
        demand=lambda: demand,
    )
    ids = []
    for m in (A, B):
        (s,) = [x for x in lc.request(m, 0) if isinstance(x, StartInstance)]
        assert lc.started(s.instance, url="http://x", load_s=5, now=1) == [JoinEndpoint(s.instance)]
        ids.append(s.instance)
    lc.get(ids[0]).last_used = 3  # type: ignore[union-attr]  # a used last...
    lc.get(ids[1]).last_used = 2  # type: ignore[union-attr]  # ...b idle longer
    return lc, ids[0], ids[1]


def test_cace_keeps_the_model_with_more_recent_traffic_when_the_queue_says_nothing() -> None:
    # Nothing queued for a or b (their requests are placed at once); b is most of the recent traffic.
    demand = Demand(window=(C,), recent_share={A: 0.05, B: 0.6, C: 0.35})
    lc, a, b = _lifecycle(CaceEvictor(CaceParams()), demand)
    acts = lc.request(C, 20)
    assert LeaveEndpoint(a) in acts
    assert LeaveEndpoint(b) not in acts
    lru, a2, b2 = _lifecycle(LruEvictor(), demand)
    acts = lru.request(C, 20)
    assert LeaveEndpoint(b2) in acts  # LRU takes the one idle longest
    assert LeaveEndpoint(a2) not in acts


def test_every_eviction_plan_is_reported_and_other_evictors_can_be_asked() -> None:
    demand = Demand(window=(C,), recent_share={A: 0.05, B: 0.6, C: 0.35})
    lc, a, b = _lifecycle(CaceEvictor(CaceParams()), demand)
    seen: list[EvictionDecision] = []
    lc.on_eviction = seen.append
    assert lc.eviction_victims(C, 20, LruEvictor()) == (b,)  # a what-if: nothing changes, nothing reported
    assert seen == []
    assert lc.get(b).state is InstanceState.READY  # type: ignore[union-attr]
    lc.request(C, 20)
    (d,) = seen
    assert (d.model, d.node, d.victims, d.demand) == (C, "n1", (a,), demand)
    assert {c.instance for c in d.candidates} == {a, b}
    assert {c.instance: c.first_pending for c in d.candidates} == {a: 1 + 19.0, b: 1 + 1 / 0.6 - 1}
    assert not any(c.queued for c in d.candidates)  # predicted, not queued


def test_a_candidate_with_a_queued_request_is_marked_queued() -> None:
    demand = Demand(window=(C, A), recent_share={A: 0.05, B: 0.6, C: 0.35})
    lc, a, b = _lifecycle(CaceEvictor(CaceParams()), demand)
    seen: list[EvictionDecision] = []
    lc.on_eviction = seen.append
    lc.request(C, 20)
    (d,) = seen
    assert {c.instance: (c.first_pending, c.queued) for c in d.candidates} == {
        a: (1.0, True),
        b: (2 + 1 / 0.6 - 1, False),
    }
    assert lc.eviction_victims(ModelName("nope"), 20, LruEvictor()) is None
