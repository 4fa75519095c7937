"""How long a `RunningRequest` outlives its request: the views that caches keep between decisions hold
completed requests' records (and the copies progress reports superseded) until each cache's next rebuild,
so their number is bounded by the fleet, not by the time it has run (gateway/sched/running.py).

Census by `gc.get_objects` (a `RunningRequest` is a slotted dataclass without weak references): the
scheduler under each shipped policy, four endpoints of four seats, requests with deadlines, progress
reports every step as streams make them."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from gateway.config.policy import load_policy
from gateway.core.clock import FakeClock
from gateway.core.types import EndpointHealth, EndpointId, EngineKind, ModelName, RequestId
from gateway.sched.decisions import Decision, Dispatch
from gateway.sched.plugins import default_registry
from gateway.sched.running import RunningRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointEstimates
from gateway.sched.types import EndpointSpec
from tests.unit.slo_fixtures import COEF, req

POLICIES = Path(__file__).resolve().parents[2] / "policies"
MODEL = ModelName("m")
ENDPOINTS, CAP = 4, 4
SEATS = ENDPOINTS * CAP


class Fleet:
    def __init__(self, policy: str) -> None:
        self.clock = FakeClock(0.0)
        self.sched = Scheduler(
            load_policy(POLICIES / f"{policy}.toml", default_registry(), seed=1), self.clock
        )
        specs = [
            EndpointSpec(
                EndpointId(f"e{i}"), f"http://e{i}:8000", EngineKind.VLLM, frozenset({MODEL}), cap=CAP
            )
            for i in range(ENDPOINTS)
        ]
        self.sched.sync_endpoints(specs)
        for s in specs:
            self.sched.set_health(s.id, EndpointHealth.READY)
            self.sched.set_estimates(s.id, EndpointEstimates(perf=COEF, kv_capacity_tokens=100_000.0))
        self.running: dict[RequestId, int] = {}  # request -> tokens streamed
        self.n = 0

    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Dispatch):
                self.running[d.req.id] = 0

    def submit(self, prefix: str) -> RequestId:
        self.n += 1
        r = req(f"{prefix}{self.n}", arrival=self.clock.now(), prompt=200, out=64.0, e2e_ms=60_000.0)
        d = self.sched.submit(r)
        self._apply([] if d is None else [d])
        return r.id

    def step(self) -> None:
        """10 ms: every stream reports 16 more tokens, the oldest request finishes, a tick."""
        self.clock.advance(0.01)
        for rid in list(self.running):
            self.running[rid] += 16
            self.sched.progress(rid, self.running[rid], self.clock.now() - 0.005)
        done = next(iter(self.running))
        del self.running[done]
        self._apply(self.sched.complete(done))
        self._apply(self.sched.tick())

    def burst(self, prefix: str, n: int) -> set[RequestId]:
        """`n` requests at once (more than the seats: a queue), served until every one finished."""
        ids = {self.submit(prefix) for _ in range(n)}
        while any(r in ids for r in self.running) or self.sched.queue_depth(MODEL):
            self.step()
        return ids


def alive(ids: set[RequestId] | None = None) -> int:
    """`RunningRequest`s reachable (of `ids`, or all)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is RunningRequest and (ids is None or o.id in ids))


@pytest.mark.parametrize("policy", sorted(p.stem for p in POLICIES.glob("*.toml")))
def test_a_finished_burst_is_let_go_when_the_next_one_rebuilds_the_caches(policy: str) -> None:
    fleet = Fleet(policy)
    first = fleet.burst("a", 2 * SEATS + 8)
    # Kept views may still hold the first burst's records here (how many depends on the policy's caches;
    # with light traffic after it they stay until contention rebuilds those caches) ...
    fleet.burst("b", 2 * SEATS + 8)
    assert alive(first) == 0  # ... a burst like it later rebuilds every one: none outlives it


def test_a_standing_queue_keeps_a_bounded_number_alive() -> None:
    """The records alive under a standing queue do not grow with the run: they stay below five times the
    seats (running requests, the copies their progress reports superseded, and completed ones, held by
    the views the caches last kept)."""
    fleet = Fleet("coding-assistant")
    for _ in range(SEATS + 24):
        fleet.submit("q")
    counts = []
    for k in range(1, 1201):
        fleet.submit("q")
        fleet.step()
        if k % 200 == 0:
            assert len(fleet.running) == SEATS  # a standing queue
            assert fleet.sched.queue_depth(MODEL) > 0
            counts.append(alive())
    assert max(counts) <= 5 * SEATS, counts
