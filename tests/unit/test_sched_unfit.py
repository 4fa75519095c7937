"""A request that fit nowhere is tried again only on the endpoints that changed (`gateway.sched.unfit`):
the same choices as trying every endpoint when a filter's verdict depends on the request and the endpoint
alone, and tried everywhere again after `RETRY_ALL_S` where it moves with the clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.clock import FakeClock
from gateway.core.types import SLO, ApiKind, EndpointId, EngineGauges, ModelName, RequestId
from gateway.sched import unfit
from gateway.sched.decisions import Decision, Dispatch
from gateway.sched.interfaces import Filter
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from gateway.sched.types import QueueLimits
from tests.unit.slo_fixtures import running, view
from tests.unit.test_sched_scheduler import READY, policy, spec


@dataclass
class Sizes:
    """Keeps the endpoints whose number is not the request's prompt size modulo 3 (a verdict of the
    request and the endpoint alone)."""

    name: str = "sizes"

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        return [e for e in candidates if int(e.id[1:]) % 3 != req.prompt_tokens % 3]


@dataclass
class After:
    """Lets nothing through before `at` (a verdict that moves with the clock alone)."""

    at: float
    name: str = "after"

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        return list(candidates) if snap.now >= self.at else []


START = FakeClock().now()


def _request(name: str, prompt: int, now: float) -> SchedRequest:
    return SchedRequest(
        id=RequestId(name),
        model=ModelName("m"),
        api=ApiKind.CHAT,
        arrival=now,
        slo=SLO(),
        prompt_tokens=prompt,
        max_tokens=None,
        stream=False,
    )


def _scheduler(filters: Sequence[Filter], n: int, cap: int) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    pol = dataclasses.replace(policy(filters=filters), lookahead=3)
    sched = Scheduler(pol, clock, QueueLimits(max_wait_s=1e9))
    specs = [spec(f"e{i}", cap=cap) for i in range(n)]
    sched.sync_endpoints(specs)
    for s in specs:
        sched.set_health(s.id, READY)
    return sched, clock


def _run(events: list[tuple[str, int]], n: int, cap: int) -> list[tuple[str, str]]:
    """The dispatches (request, endpoint) of a script of events, in order."""
    sched, clock = _scheduler([Sizes()], n, cap)
    running: list[RequestId] = []
    out: list[tuple[str, str]] = []

    def note(ds: Sequence[Decision | None]) -> None:
        for d in ds:
            if isinstance(d, Dispatch):
                running.append(d.req.id)
                out.append((d.req.id, d.endpoint.id))

    for k, (kind, arg) in enumerate(events):
        clock.advance(0.001)
        if kind == "submit":
            note([sched.submit(_request(f"r{k}", arg, clock.now()))])
        elif kind == "complete" and running:
            note(sched.complete(running.pop(arg % len(running))))
        elif kind == "progress" and running:
            sched.progress(running[arg % len(running)], 16, clock.now())
        elif kind == "tick":
            note(sched.tick())
    return out


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.sampled_from(("submit", "submit", "complete", "progress", "tick")), st.integers(0, 50)),
        max_size=80,
    ),
    n=st.integers(1, 5),
    cap=st.integers(1, 3),
)
def test_a_verdict_of_request_and_endpoint_alone_makes_the_same_choices_as_trying_every_endpoint(
    events: list[tuple[str, int]], n: int, cap: int
) -> None:
    remembered = _run(events, n, cap)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(unfit, "RETRY_ALL_S", -1.0)  # every try on every endpoint: no memo is ever used
        everywhere = _run(events, n, cap)
    assert remembered == everywhere


def test_a_request_that_fit_nowhere_is_tried_everywhere_again_after_a_while() -> None:
    sched, clock = _scheduler([After(at=START + 0.05)], 2, 4)
    assert sched.submit(_request("r", 16, clock.now())) is None
    clock.advance(0.06)
    # its verdict moved with the clock only: no endpoint changed, so it is not tried yet
    assert sched.tick() == []
    clock.advance(unfit.RETRY_ALL_S * 2)
    (d,) = sched.tick()
    assert isinstance(d, Dispatch)
    assert d.req.id == "r"


def test_an_endpoint_that_changed_is_tried_at_once() -> None:
    sched, clock = _scheduler([After(at=START + 0.05)], 2, 4)
    assert sched.submit(_request("r", 16, clock.now())) is None
    assert sched.submit(_request("s", 16, clock.now())) is None
    clock.advance(0.06)
    sched.observe_gauges(EndpointId("e0"), EngineGauges(running=0.0, waiting=0.0, kv_usage=0.1))  # e0 changed
    (d,) = [d for d in sched.tick() if isinstance(d, Dispatch)][:1]
    assert d.req.id == "r"
    assert d.endpoint.id == "e0"


@settings(max_examples=100, deadline=None)
@given(
    moves=st.lists(
        st.lists(st.sampled_from(("same", "progress", "seat")), min_size=4, max_size=4), max_size=6
    )
)
def test_the_changed_endpoints_are_those_a_walk_finds_however_the_pairs_are_asked(
    moves: list[list[str]],
) -> None:
    snaps = [tuple(view(f"e{k}", cap=4) for k in range(4))]
    for step in moves:
        last = snaps[-1]
        snaps.append(
            tuple(
                v
                if how == "same"
                else dataclasses.replace(v, running=v.running)
                if how == "progress"
                else view(v.id, cap=4, runs=[*v.running, running(f"{v.id}-{len(v.running)}")])
                for v, how in zip(last, step, strict=True)
            )
        )
    pairs = [(a, b) for a in snaps for b in snaps] * 2
    for new, old in pairs:
        walked = tuple(v for v, o in zip(new, old, strict=True) if v is not o and unfit._moved(v, o))
        assert unfit.changed(new, old) == walked
