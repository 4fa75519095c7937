"""A start the agent refuses for memory (its NVML-measured ledger has less room than the gateway's plan):
the instance state machine plans the model again (elsewhere, evicting more, or waiting) within the load
deadline instead of failing its requests. Playbooks on a fake clock."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.core.types import ModelName
from gateway.lifecycle.instances import (
    REFUSAL_RETRY_S,
    Action,
    DeviceSpec,
    InstanceState,
    JoinEndpoint,
    LeaveEndpoint,
    Lifecycle,
    LifecycleSettings,
    LoadFailed,
    ModelSpec,
    NodeSpec,
    StartInstance,
    StopInstance,
)
from gateway.sched.plugins.eviction.lru import LruEvictor

GIB = 1 << 30
A, B, C = ModelName("a"), ModelName("b"), ModelName("c")
MODELS = {m: ModelSpec(m, 10 * GIB, load_s=5) for m in (A, B, C)}
SETTINGS = LifecycleSettings(churn_guard_s=0, drain_timeout_s=5, load_deadline_s=100)


def make(*nodes: NodeSpec) -> Lifecycle:
    return Lifecycle(models=MODELS, nodes=list(nodes), evictor=LruEvictor(), settings=SETTINGS)


def node(name: str, gib: int = 30) -> NodeSpec:
    return NodeSpec(name, (DeviceSpec("gpu0", gib * GIB),))


def starts(actions: Sequence[Action]) -> list[StartInstance]:
    return [a for a in actions if isinstance(a, StartInstance)]


def load(lc: Lifecycle, model: ModelName, now: float) -> str:
    (s,) = starts(lc.request(model, now))
    assert lc.started(s.instance, url="http://x", load_s=1.0, now=now + 1) == [JoinEndpoint(s.instance)]
    return s.instance


def test_a_refused_start_evicts_more_instead_of_failing() -> None:
    # The gateway counts a and b (20 GiB of 30): c fits. The agent measures a's engine at 15 GiB (drift)
    # and refuses with 5 GiB free. The core learns the 5 GiB it did not count and evicts for c.
    lc = make(node("n1"))
    a = load(lc, A, 0)
    load(lc, B, 0)
    (s,) = starts(lc.request(C, 10))
    acts = lc.start_refused(s.instance, "insufficient_memory: ...", 10.5, agent_free={"gpu0": 5 * GIB})
    assert not any(isinstance(x, LoadFailed) for x in acts)
    assert acts == []  # planned again only after the retry pause
    assert lc.get(s.instance).state is InstanceState.FAILED  # type: ignore[union-attr]
    assert C in lc.wanted()
    acts = lc.tick(10.5 + REFUSAL_RETRY_S)
    assert LeaveEndpoint(a) in acts  # the least recently used goes now that the plan counts the drift
    assert StopInstance(a, "n1", "evicted", "lru") in acts
    assert starts(acts) == []  # the new instance waits for its victim
    (again,) = starts(lc.stopped(a, 13))
    assert again.model == C
    assert again.instance != s.instance


def test_a_refused_start_goes_to_another_node_with_room() -> None:
    lc = make(node("n1"), node("n2", gib=20))
    (s,) = starts(lc.request(B, 5))  # best fit: the fuller node, keeping n1's bigger hole
    assert s.node == "n2"
    lc.start_refused(s.instance, "insufficient_memory: ...", 6, agent_free={"gpu0": 2 * GIB})
    (again,) = starts(lc.tick(6 + REFUSAL_RETRY_S))
    assert (again.model, again.node) == (B, "n1")


def test_with_nothing_to_evict_it_waits_and_fails_only_at_the_load_deadline() -> None:
    lc = make(node("n1", gib=10))
    (s,) = starts(lc.request(A, 0))
    acts = lc.start_refused(s.instance, "insufficient_memory: ...", 1, agent_free={"gpu0": 0})
    assert acts == []
    for t in range(2, 100, 10):  # nothing resident to evict, and the device counts as full: wait
        assert starts(lc.tick(t)) == []
        assert not any(isinstance(x, LoadFailed) for x in lc.tick(t))
    failed = [x for x in lc.tick(100.5) if isinstance(x, LoadFailed)]
    assert [f.model for f in failed] == [A]  # the deadline runs from the first request (t=0), not the refusal


def test_the_drift_is_forgotten_once_an_instance_there_stops() -> None:
    lc = make(node("n1"))
    a = load(lc, A, 0)
    (s,) = starts(lc.request(B, 5))
    lc.start_refused(s.instance, "insufficient_memory: ...", 5, agent_free={"gpu0": 0})
    acts = lc.tick(5 + REFUSAL_RETRY_S)  # 20 GiB unaccounted: b can only go where a is
    assert LeaveEndpoint(a) in acts
    (again,) = starts(lc.stopped(a, 8))
    assert again.model == B
    # a's engine (the drift) is gone: the device counts its full size again, so c starts beside b.
    assert lc.started(again.instance, url="http://x", load_s=1.0, now=9)[0] == JoinEndpoint(again.instance)
    assert [x.model for x in starts(lc.request(C, 10))] == [C]


def test_a_refusal_without_numbers_retries_after_the_pause() -> None:
    # device_busy / memory_not_released carry no usable free bytes: the same plan is tried again later.
    lc = make(node("n1"))
    (s,) = starts(lc.request(A, 0))
    assert lc.start_refused(s.instance, "device_busy: ...", 1) == []
    assert starts(lc.tick(1 + REFUSAL_RETRY_S / 2)) == []
    (again,) = starts(lc.tick(1 + REFUSAL_RETRY_S))
    assert again.model == A


def test_a_refusal_of_an_instance_not_loading_is_ignored() -> None:
    lc = make(node("n1"))
    a = load(lc, A, 0)
    assert lc.start_refused(a, "insufficient_memory: ...", 5, agent_free={"gpu0": 0}) == []
    assert lc.get(a).state is InstanceState.READY  # type: ignore[union-attr]
