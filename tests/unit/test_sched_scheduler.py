"""Scheduler events in, decisions out: scripted playbooks on a fake clock (no sockets, no sleeps)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.core.clock import FakeClock
from gateway.core.errors import ErrorSource
from gateway.core.types import (
    SLO,
    ApiKind,
    EndpointHealth,
    EndpointId,
    EngineGauges,
    EngineKind,
    ModelName,
    RequestId,
)
from gateway.sched.decisions import Decision, Dispatch, Reject
from gateway.sched.interfaces import ADMIT, Filter
from gateway.sched.plugins import default_registry
from gateway.sched.profile import Policy, SchedulerProfile, WeightedScorer
from gateway.sched.registry import PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from gateway.sched.types import EndpointSpec, QueueLimits

M = ModelName("m")
READY, UNHEALTHY, STARTING = EndpointHealth.READY, EndpointHealth.UNHEALTHY, EndpointHealth.STARTING


def eid(name: str) -> EndpointId:
    return EndpointId(name)


def rid(name: str) -> RequestId:
    return RequestId(name)


def spec(
    name: str, *, cap: int = 1, models: Iterable[str] | None = ("m",), url: str | None = None
) -> EndpointSpec:
    return EndpointSpec(
        id=eid(name),
        url=url or f"http://{name}:8000",
        engine=EngineKind.VLLM,
        models=frozenset(ModelName(m) for m in (models or ())),
        cap=cap,
    )


def policy(picker: str = "max-score", *, filters: Sequence[Filter] = (), name: str = "test") -> Policy:
    reg = default_registry()
    return Policy(
        name=name,
        ordering=reg.build(PluginKind.ORDERING, "fcfs", None, path="ordering"),
        profile=SchedulerProfile(
            filters=tuple(filters),
            scorers=(WeightedScorer(reg.build(PluginKind.SCORER, "least-outstanding", None, path="s"), 1.0),),
            picker=reg.build(PluginKind.PICKER, picker, None, path="picker"),
        ),
    )


class Fleet:
    """A scheduler on a fake clock with every given endpoint READY."""

    def __init__(
        self, *specs: EndpointSpec, limits: QueueLimits | None = None, pol: Policy | None = None
    ) -> None:
        self.clock = FakeClock()
        self.sched = Scheduler(pol or policy(), self.clock, limits or QueueLimits())
        assert self.sched.sync_endpoints(specs) == []
        for s in specs:
            self.sched.set_health(s.id, READY)

    def req(self, name: str, model: str = "m", *, arrival: float | None = None) -> SchedRequest:
        return SchedRequest(
            id=rid(name),
            model=ModelName(model),
            api=ApiKind.CHAT,
            arrival=self.clock.now() if arrival is None else arrival,
            slo=SLO(),
            prompt_tokens=16,
            max_tokens=None,
            stream=False,
        )

    def submit(
        self, name: str, model: str = "m", *, exclude: frozenset[EndpointId] = frozenset()
    ) -> Decision | None:
        return self.sched.submit(self.req(name, model), exclude=exclude)

    def inflight(self) -> dict[str, int]:
        return {e.id: e.inflight for e in self.sched.snapshot().endpoints}

    def view(self, name: str) -> EndpointView:
        v = self.sched.snapshot().get(eid(name))
        assert v is not None
        return v


def placed(d: Decision | None) -> tuple[str, str] | None:
    """(request, endpoint) of a Dispatch; None when the request waits."""
    if d is None:
        return None
    assert isinstance(d, Dispatch), d
    return (d.req.id, d.endpoint.id)


def dispatched(ds: Sequence[Decision]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for d in ds:
        assert isinstance(d, Dispatch), d
        out.append((d.req.id, d.endpoint.id))
    return out


def rejected(d: Decision | None) -> Reject:
    assert isinstance(d, Reject), d
    return d


@dataclass
class BlockAll:
    """A filter that lets nothing through (e.g. a policy that holds traffic)."""

    name: str = "block-all"

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        return []


# ----------------------------------------------------------------- submit / complete
def test_submit_dispatches_at_once_when_there_is_room() -> None:
    f = Fleet(spec("e1", cap=2))
    assert placed(f.submit("a")) == ("a", "e1")
    assert placed(f.submit("b")) == ("b", "e1")
    assert f.inflight() == {"e1": 2}
    assert f.sched.running_on(rid("a")) == "e1"
    assert f.sched.queue_depth(M) == 0


def test_submit_queues_at_cap_and_complete_dispatches_the_head() -> None:
    f = Fleet(spec("e1", cap=1))
    assert placed(f.submit("a")) == ("a", "e1")
    assert f.submit("b") is None
    f.clock.advance(1)
    assert f.submit("c") is None
    assert f.sched.queue_depth(M) == 2
    assert dispatched(f.sched.complete(rid("a"))) == [("b", "e1")]
    assert f.inflight() == {"e1": 1}
    assert f.sched.queue_depth(M) == 1
    assert dispatched(f.sched.complete(rid("b"))) == [("c", "e1")]
    assert f.sched.complete(rid("c")) == []
    assert f.inflight() == {"e1": 0}


@pytest.mark.parametrize(
    "req_id",
    [pytest.param("never-submitted", id="unknown"), pytest.param("a", id="completed-twice")],
)
def test_complete_of_a_request_not_running_is_a_no_op(req_id: str) -> None:
    f = Fleet(spec("e1", cap=1))
    f.submit("a")
    f.submit("b")
    f.sched.complete(rid("a"))
    assert f.sched.complete(rid(req_id)) == []
    assert f.inflight() == {"e1": 1}


@pytest.mark.parametrize(
    ("arrivals", "expected"),
    [
        pytest.param({"a": 1.0, "b": 2.0, "c": 3.0}, ["a", "b", "c"], id="in-order"),
        pytest.param({"c": 3.0, "a": 1.0, "b": 2.0}, ["a", "b", "c"], id="submitted-out-of-order"),
        pytest.param({"x": 5.0, "y": 5.0, "z": 4.0}, ["z", "x", "y"], id="ties-keep-submission-order"),
    ],
)
def test_fcfs_serves_the_queue_by_arrival_not_by_submission(
    arrivals: dict[str, float], expected: list[str]
) -> None:
    f = Fleet(spec("e1", cap=1))
    f.submit("running")
    for name, t in arrivals.items():
        assert f.sched.submit(f.req(name, arrival=1000.0 + t)) is None
    order: list[str] = []
    last = "running"
    for _ in arrivals:
        ((last, _ep),) = dispatched(f.sched.complete(rid(last)))
        order.append(last)
    assert order == expected


def test_queue_full_is_rejected_with_429_and_retry_after() -> None:
    f = Fleet(spec("e1", cap=1), limits=QueueLimits(max_queue_per_model=2, retry_after_s=2.5))
    f.submit("run")
    assert f.submit("q1") is None
    assert f.submit("q2") is None
    err = rejected(f.submit("q3")).error
    assert (err.status, err.code, err.source) == (429, "queue_full", ErrorSource.GATEWAY)
    assert err.retry_after_s == 2.5
    assert err.headers() == {"Retry-After": "2"}
    assert f.sched.queue_depth(M) == 2


def test_each_model_has_its_own_queue_limit() -> None:
    f = Fleet(spec("e1", cap=1, models=("m", "n")), limits=QueueLimits(max_queue_per_model=1))
    f.submit("run")
    assert f.submit("q1") is None
    assert rejected(f.submit("q2")).error.code == "queue_full"
    assert f.submit("n1", "n") is None
    assert f.sched.queue_depths() == {"m": 1, "n": 1}


def _no_endpoints() -> Fleet:
    return Fleet()


def _starting() -> Fleet:
    f = Fleet()
    f.sched.sync_endpoints([spec("e1")])
    return f


def _unhealthy() -> Fleet:
    f = Fleet(spec("e1"))
    f.sched.set_health(eid("e1"), UNHEALTHY)
    return f


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_no_endpoints, id="no-endpoints"),
        pytest.param(_starting, id="starting"),
        pytest.param(_unhealthy, id="unhealthy"),
        pytest.param(lambda: Fleet(spec("e1", models=("other",))), id="serves-another-model"),
        pytest.param(lambda: Fleet(spec("e1", models=None)), id="models-not-discovered-yet"),
    ],
)
def test_no_ready_endpoint_for_the_model_is_503(make: Callable[[], Fleet]) -> None:
    f = make()
    err = rejected(f.submit("a")).error
    assert (err.status, err.code) == (503, "no_ready_endpoint")
    assert err.retry_after_s == QueueLimits().retry_after_s
    assert f.sched.queue_depth(M) == 0


# ----------------------------------------------------------------- tick / cancel
@pytest.mark.parametrize(
    ("waited", "expires"),
    [
        pytest.param(0.0, False, id="fresh"),
        pytest.param(29.9, False, id="just-under"),
        pytest.param(30.0, False, id="exactly-max-wait"),
        pytest.param(30.1, True, id="past-max-wait"),
    ],
)
def test_tick_expires_requests_past_max_wait(waited: float, expires: bool) -> None:
    f = Fleet(spec("e1", cap=1), limits=QueueLimits(max_wait_s=30.0, retry_after_s=1.0))
    f.submit("running")
    f.submit("waiting")
    f.clock.advance(waited)
    out = f.sched.tick()
    if expires:
        (d,) = out
        err = rejected(d).error
        assert rejected(d).req.id == "waiting"
        assert (err.status, err.code, err.outcome) == (503, "queue_timeout", "queue_timeout")
        assert err.retry_after_s == 1.0
        assert f.sched.queue_depth(M) == 0
    else:
        assert out == []
        assert f.sched.queue_depth(M) == 1
    assert f.sched.running_on(rid("running")) == "e1", "running requests never time out in the queue"


def test_tick_only_expires_the_old_ones() -> None:
    f = Fleet(spec("e1", cap=1), limits=QueueLimits(max_wait_s=10.0))
    f.submit("running")
    f.submit("old")
    f.clock.advance(6)
    f.submit("young")
    f.clock.advance(6)
    assert [(rejected(d).req.id, rejected(d).error.code) for d in f.sched.tick()] == [
        ("old", "queue_timeout")
    ]
    assert dispatched(f.sched.complete(rid("running"))) == [("young", "e1")]


def test_cancel_removes_a_queued_request_that_is_then_never_dispatched() -> None:
    f = Fleet(spec("e1", cap=1))
    f.submit("running")
    f.submit("gone")
    f.submit("stays")
    assert f.sched.cancel(rid("gone")) is True
    assert f.sched.queue_depth(M) == 1
    assert dispatched(f.sched.complete(rid("running"))) == [("stays", "e1")]
    f.clock.advance(60)
    assert f.sched.tick() == []
    assert dispatched(f.sched.complete(rid("stays"))) == []
    assert f.sched.running_on(rid("gone")) is None


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("running", id="running"),
        pytest.param("nobody", id="unknown"),
        pytest.param("q", id="twice"),
    ],
)
def test_cancel_of_something_not_queued_is_false(name: str) -> None:
    f = Fleet(spec("e1", cap=1))
    f.submit("running")
    f.submit("q")
    if name == "q":
        assert f.sched.cancel(rid("q"))
    assert f.sched.cancel(rid(name)) is False
    assert f.sched.running_on(rid("running")) == "e1"


def test_submit_only_ever_decides_for_its_own_request() -> None:
    """Regression: submit returns one decision, so it must not dispatch another queued request.

    Before the fix, `c`'s submit placed `b` (unblocked by the cancel) and dropped that Dispatch: nobody
    learned `b` was running and its slot leaked.
    """
    f = Fleet(spec("e1"), spec("e2"))
    f.submit("x")  # e1
    f.submit("y")  # e2
    f.sched.complete(rid("x"))  # e1 free
    assert f.submit("a", exclude=frozenset({eid("e1")})) is None  # waits for e2
    assert f.submit("b") is None  # strict priority: behind a
    assert f.sched.cancel(rid("a"))
    assert f.submit("c") is None
    assert f.sched.running_on(rid("b")) is None
    assert f.inflight() == {"e1": 0, "e2": 1}
    assert dispatched(f.sched.tick()) == [("b", "e1")]


# ----------------------------------------------------------------- endpoint set
def test_sync_endpoints_adds_an_endpoint_that_serves_the_queue_once_ready() -> None:
    f = Fleet(spec("e1", cap=1))
    f.submit("a")
    f.submit("b")
    assert f.sched.sync_endpoints([spec("e1", cap=1), spec("e2", cap=1)]) == []  # e2 is STARTING
    assert f.view("e2").health is STARTING
    assert dispatched(f.sched.set_health(eid("e2"), READY)) == [("b", "e2")]


def test_a_removed_endpoint_gets_no_new_work_and_its_completions_are_harmless() -> None:
    f = Fleet(spec("e1", cap=1), spec("e2", cap=1))
    assert placed(f.submit("on-e1")) == ("on-e1", "e1")
    assert f.sched.sync_endpoints([spec("e2", cap=1)]) == []
    assert f.sched.endpoint_ids() == ["e2"]
    assert placed(f.submit("a")) == ("a", "e2")
    assert f.submit("b") is None
    assert f.sched.complete(rid("on-e1")) == []
    assert f.inflight() == {"e2": 1}
    assert f.sched.queue_depth(M) == 1


def test_complete_after_an_endpoint_was_removed_and_added_again_does_not_go_negative() -> None:
    """Regression: the re-added endpoint starts at 0 in flight; the old request must not decrement it."""
    f = Fleet(spec("e1", cap=1))
    f.submit("old")
    f.sched.sync_endpoints([])
    f.sched.sync_endpoints([spec("e1", cap=1)])
    f.sched.set_health(eid("e1"), READY)
    assert f.sched.complete(rid("old")) == []
    assert f.inflight() == {"e1": 0}
    assert placed(f.submit("new")) == ("new", "e1")
    assert f.submit("next") is None, "the cap still holds"


@pytest.mark.parametrize(
    ("new", "health", "inflight", "cap"),
    [
        pytest.param(spec("e1", cap=3), READY, 1, 3, id="same-url-keeps-state"),
        pytest.param(
            spec("e1", cap=1, url="http://elsewhere:8000"), STARTING, 1, 1, id="new-url-starts-over"
        ),
    ],
)
def test_sync_endpoints_keeps_runtime_state_of_endpoints_that_stay(
    new: EndpointSpec, health: EndpointHealth, inflight: int, cap: int
) -> None:
    f = Fleet(spec("e1", cap=1))
    f.submit("a")
    f.sched.sync_endpoints([new])
    v = f.view("e1")
    assert (v.health, v.inflight, v.cap, v.url) == (health, inflight, cap, new.url)
    f.sched.complete(rid("a"))
    assert f.inflight() == {"e1": 0}


# ----------------------------------------------------------------- health and models
def test_unhealthy_stops_placement_and_ready_again_serves_the_queue() -> None:
    f = Fleet(spec("e1", cap=1))
    f.submit("a")
    f.submit("b")
    assert f.sched.set_health(eid("e1"), UNHEALTHY) == []
    assert f.sched.complete(rid("a")) == [], "no placement on an unhealthy endpoint"
    assert f.sched.queue_depth(M) == 1
    assert rejected(f.submit("c")).error.status == 503
    assert dispatched(f.sched.set_health(eid("e1"), READY)) == [("b", "e1")]


def test_unhealthy_endpoint_is_avoided_while_another_serves() -> None:
    f = Fleet(spec("e1", cap=4), spec("e2", cap=4))
    f.sched.set_health(eid("e1"), UNHEALTHY)
    assert [placed(f.submit(f"r{i}")) for i in range(3)] == [("r0", "e2"), ("r1", "e2"), ("r2", "e2")]


def test_tick_rejects_queued_requests_whose_model_has_no_ready_endpoint_left() -> None:
    f = Fleet(spec("e1", cap=1))
    f.submit("a")
    f.submit("b")
    f.sched.set_health(eid("e1"), UNHEALTHY)
    (d,) = f.sched.tick()
    assert (rejected(d).req.id, rejected(d).error.code) == ("b", "no_ready_endpoint")


def test_set_models_makes_a_discovering_endpoint_serve() -> None:
    f = Fleet(spec("busy", cap=1, models=("m", "n")), spec("disc", cap=1, models=None))
    assert f.view("disc").models == frozenset()
    f.submit("run", "n")
    assert f.submit("waits", "n") is None
    assert dispatched(f.sched.set_models(eid("disc"), ["n"])) == [("waits", "disc")]
    assert f.sched.models(ready_only=True) == {"m", "n"}
    assert f.sched.set_models(eid("disc"), ["n"]) == [], "unchanged models: nothing to do"


def test_set_models_is_ignored_when_the_models_are_configured() -> None:
    f = Fleet(spec("e1", models=("m",)))
    assert f.sched.set_models(eid("e1"), ["other"]) == []
    assert f.view("e1").models == {"m"}
    assert f.sched.set_models(eid("missing"), ["m"]) == []


# ----------------------------------------------------------------- engine gauges
@pytest.mark.parametrize(
    ("age", "fresh", "choice"),
    [
        pytest.param(0.0, True, "e2", id="fresh"),
        pytest.param(10.0, True, "e2", id="exactly-stale-after"),
        pytest.param(10.5, False, "e1", id="stale-fails-open-to-gateway-counts"),
    ],
)
def test_stale_engine_gauges_are_dropped_and_routing_continues(age: float, fresh: bool, choice: str) -> None:
    f = Fleet(spec("e1", cap=4), spec("e2", cap=4), limits=QueueLimits(stale_after_s=10.0))
    assert f.sched.observe_gauges(eid("e1"), EngineGauges(running=3.0, waiting=9.0, kv_usage=0.8)) == []
    f.clock.advance(age)
    v = f.view("e1")
    assert v.scraped_at is not None
    assert f.clock.now() - v.scraped_at == age
    if fresh:
        assert (v.engine_running, v.engine_waiting, v.kv_usage) == (3.0, 9.0, 0.8)
    else:
        assert (v.engine_running, v.engine_waiting, v.kv_usage) == (None, None, None)
        assert not v.fresh
    assert placed(f.submit("r")) == ("r", choice)


def test_observe_gauges_resets_dispatched_since_scrape() -> None:
    f = Fleet(spec("e1", cap=4))
    f.submit("a")
    f.submit("b")
    assert f.view("e1").dispatched_since_scrape == 2
    f.sched.observe_gauges(eid("e1"), EngineGauges(running=2.0, waiting=0.0))
    assert f.view("e1").dispatched_since_scrape == 0
    assert f.sched.observe_gauges(eid("unknown"), EngineGauges()) == []


# ----------------------------------------------------------------- retries
@pytest.mark.parametrize(
    ("fleet", "exclude", "expected"),
    [
        pytest.param(("e1", "e2"), {"e1"}, "e2", id="avoids-the-failed-endpoint"),
        pytest.param(("e1", "e2"), {"e2"}, "e1", id="avoids-the-other-one-too"),
        pytest.param(("e1",), {"e1"}, "e1", id="falls-back-when-it-is-the-only-one"),
        pytest.param(("e1", "e2"), {"e1", "e2"}, "e1", id="falls-back-when-all-failed"),
        pytest.param(("e1", "e2"), {"gone"}, "e1", id="unknown-exclude-is-harmless"),
    ],
)
def test_retry_with_exclude(fleet: tuple[str, ...], exclude: set[str], expected: str) -> None:
    f = Fleet(*(spec(n, cap=2) for n in fleet))
    assert placed(f.submit("retry", exclude=frozenset(eid(e) for e in exclude))) == ("retry", expected)


def test_retry_falls_back_when_the_only_other_endpoint_is_not_ready() -> None:
    f = Fleet(spec("e1", cap=2), spec("e2", cap=2))
    f.sched.set_health(eid("e2"), UNHEALTHY)
    assert placed(f.submit("retry", exclude=frozenset({eid("e1")}))) == ("retry", "e1")


def test_retry_waits_for_the_other_endpoint_rather_than_the_failed_one() -> None:
    f = Fleet(spec("e1", cap=1), spec("e2", cap=1))
    f.submit("x")  # e1
    f.submit("y")  # e2
    f.sched.complete(rid("x"))  # e1 has room, but the retry failed there
    assert f.submit("retry", exclude=frozenset({eid("e1")})) is None
    assert dispatched(f.sched.complete(rid("y"))) == [("retry", "e2")]


# ----------------------------------------------------------------- policy
def test_set_policy_swaps_in_one_step_and_serves_the_queue() -> None:
    held = policy(filters=[BlockAll()], name="hold")
    f = Fleet(spec("e1", cap=2), spec("e2", cap=2), pol=held)
    assert f.submit("a") is None
    assert f.submit("b") is None
    assert f.sched.tick() == []
    rr = policy("round-robin", name="rr")
    out = f.sched.set_policy(rr)
    assert f.sched.policy is rr
    assert dispatched(out) == [("a", "e1"), ("b", "e2")]
    assert f.sched.queue_depth(M) == 0
    # The new picker decides from now on: round robin wraps instead of balancing by load.
    f.sched.complete(rid("b"))
    assert placed(f.submit("c")) == ("c", "e1")


# ----------------------------------------------------------------- a policy plugin that raises
class PluginBug(Exception):
    pass


@dataclass
class BadFor:
    """Ordering, filter and admitter in one: raises on the named requests, else behaves (FCFS, no-op)."""

    bad: set[str]
    name: str = "bad-for"
    rechecks: bool = True

    def _check(self, req: SchedRequest) -> None:
        if req.id in self.bad:
            raise PluginBug(f"bug on {req.id}")

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> tuple[float, ...]:
        self._check(req)
        return (req.arrival,)

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        self._check(req)
        return candidates

    def admit(self, req: SchedRequest, snap: FleetSnapshot, queued_in_class: Callable[[str], int]) -> Any:
        self._check(req)
        return ADMIT

    def recheck(self, req: SchedRequest, snap: FleetSnapshot) -> Any:
        self._check(req)
        return ADMIT


def _buggy(stage: str, bad: set[str]) -> Policy:
    plugin = BadFor(bad)
    base = policy(filters=[plugin] if stage == "placement" else ())
    return dataclasses.replace(
        base,
        ordering=plugin if stage == "ordering" else base.ordering,
        admitter=plugin if stage == "admission" else None,
    )


def _internal(d: Decision) -> str:
    assert isinstance(d, Reject), d
    assert (d.error.status, d.error.code) == (500, "internal_error")
    assert "bug" not in d.error.message  # the exception's text stays in the log
    return d.req.id


@pytest.mark.parametrize("stage", ["ordering", "placement"])
def test_a_plugin_that_raises_fails_only_the_request_it_decided_on(stage: str) -> None:
    bad: set[str] = set()
    f = Fleet(spec("e1", cap=1), pol=_buggy(stage, bad))
    assert placed(f.submit("run")) == ("run", "e1")
    for name in ("a", "bad", "b"):
        assert f.submit(name) is None
        f.clock.advance(1)
    bad.add("bad")  # the plugin fails on it from now on
    # each completion serves the queue: the faulty request is answered with a 500 (when the plugin meets
    # it: ordering looks at every queued request, placement at the one being placed), the others run
    out = [*f.sched.complete(rid("run")), *f.sched.complete(rid("a"))]
    assert [_internal(d) for d in out if isinstance(d, Reject)] == ["bad"]
    assert dispatched([d for d in out if isinstance(d, Dispatch)]) == [("a", "e1"), ("b", "e1")]
    faults = f.sched.take_faults()
    assert [(x.req_id, x.stage, type(x.error)) for x in faults][-1] == ("bad", stage, PluginBug)
    assert f.sched.take_faults() == []
    assert f.sched.queue_depth(M) == 0
    assert f.inflight() == {"e1": 1}


def test_a_submit_reports_its_own_fault_and_never_another_requests() -> None:
    bad = {"own"}
    f = Fleet(spec("e1", cap=1), spec("e2", cap=1), pol=_buggy("ordering", bad))
    assert placed(f.submit("run")) == ("run", "e1")
    assert placed(f.submit("run2")) == ("run2", "e2")
    assert f.submit("bad") is None
    assert _internal(rejected(f.submit("own"))) == "own"  # its own key failed: answered at once
    bad.add("bad")
    assert f.submit("c") is None  # serving for "c" meets the faulty "bad": nothing is reported here
    out = f.sched.complete(rid("run"))  # the next serve rejects it and goes on
    assert _internal(out[0]) == "bad"
    assert dispatched(out[1:]) == [("c", "e1")]


def test_an_admitter_that_raises_rejects_the_new_request_and_a_queued_one_on_tick() -> None:
    bad = {"new"}
    f = Fleet(spec("e1", cap=1), pol=_buggy("admission", bad))
    assert _internal(rejected(f.submit("new"))) == "new"
    assert placed(f.submit("run")) == ("run", "e1")
    assert f.submit("queued") is None
    bad.add("queued")  # now its recheck raises
    (d,) = f.sched.tick()
    assert _internal(d) == "queued"
    assert [x.stage for x in f.sched.take_faults()] == ["admission", "admission"]


async def test_the_driver_logs_each_fault_and_raises_the_500_to_its_caller() -> None:
    from structlog.testing import capture_logs

    from gateway.core.errors import BerthError
    from gateway.dispatch.driver import SchedulerDriver

    f = Fleet(spec("e1", cap=1), pol=_buggy("admission", {"bad"}))
    driver = SchedulerDriver(f.sched)
    with capture_logs() as logs, pytest.raises(BerthError) as err:
        await driver.acquire(f.req("bad"))
    assert err.value.status == 500
    [entry] = [e for e in logs if e["event"] == "policy_fault"]
    assert (entry["request_id"], entry["stage"], entry["policy"]) == ("bad", "admission", "test")
    assert isinstance(entry["exc_info"][1], PluginBug)
    assert f.sched.faults == []
