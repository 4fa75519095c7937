"""A request a tick keeps is put back at the SLO admitter's next promise (`recheck_next`), not looked at on
every tick (`gateway.sched.ticks`, `gateway.sched.checks`). Hypothesis: over random queues, clocks, refits
(inside and beyond the bounds' headroom) and a scope that changes per tick, the requests `ticks.due`
hands a tick and the admitter's recheck refuses are exactly those a recheck of every queued request
refuses, tick by tick.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.slo import default_slo_policy
from gateway.core.types import SLO, ApiKind, RequestId
from gateway.sched import ticks
from gateway.sched.interfaces import AdmitOutcome
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter, SloFeasibilityParams
from gateway.sched.queues import ModelQueue
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointEstimates, FleetSnapshot
from tests.unit.sched_builders import view
from tests.unit.test_sched_ticks import Advance, M, Refit, perf

WAIT_LIMIT = 60.0


@dataclass(frozen=True)
class Join:
    ttft_ms: float | None
    deadline_ms: float | None
    prompt: int
    out: float
    produced: int


@dataclass(frozen=True)
class Tick:
    scope: int  # which part of the fleet each request's scope leaves this tick


events = st.one_of(
    st.builds(
        Join,
        ttft_ms=st.sampled_from((None, 150.0, 700.0, 3000.0)),
        deadline_ms=st.sampled_from((None, 1500.0, 6000.0, 25000.0)),
        prompt=st.sampled_from((10, 900, 5000)),
        out=st.sampled_from((1.0, 60.0, 400.0, 1200.0)),
        produced=st.sampled_from((0, 20)),
    ),
    st.builds(Advance, seconds=st.sampled_from((0.01, 0.1, 0.35, 1.0, 4.0))),
    st.builds(
        Refit,
        endpoint=st.integers(0, 3),
        speed=st.sampled_from((0.4, 0.97, 0.99, 1.0, 1.01, 1.03, 1.2, 2.5)),
    ),
    st.builds(Tick, scope=st.integers(0, 15)),
)


def scoped(snap: FleetSnapshot, req: SchedRequest, scope: int) -> FleetSnapshot:
    """A part of the fleet (never empty) that depends on the request and the tick."""
    n = len(snap.endpoints)
    keep = (scope + int(req.id[1:])) % ((1 << n) - 1) + 1  # a non-empty subset, as a bit mask
    return dataclasses.replace(
        snap, endpoints=tuple(e for i, e in enumerate(snap.endpoints) if keep >> i & 1)
    )


@settings(max_examples=300, deadline=None)
@given(
    first=st.lists(st.sampled_from((0.5, 1.0, 1.02, 2.0)), min_size=1, max_size=4),
    script=st.lists(events, min_size=1, max_size=120),
    tail=st.sampled_from(("mean", "normal")),
)
def test_a_tick_refuses_what_a_recheck_of_the_whole_queue_refuses(
    first: list[float], script: list[object], tail: str
) -> None:
    params = SloFeasibilityParams(tail=tail, recheck="late")  # type: ignore[arg-type]  # a sampled literal
    scheduled = SloFeasibilityAdmitter(params, default_slo_policy())
    walking = SloFeasibilityAdmitter(params, default_slo_policy())
    queue = ModelQueue()
    waiting: dict[RequestId, SchedRequest] = {}
    speeds = list(first)
    now = 0.0
    for n, op in enumerate(script):
        if isinstance(op, Join):
            req = SchedRequest(
                id=RequestId(f"r{n}"),
                model=M,
                api=ApiKind.CHAT,
                arrival=now,
                slo=SLO(ttft_ms=op.ttft_ms, deadline_ms=op.deadline_ms),
                prompt_tokens=op.prompt,
                max_tokens=None,
                stream=True,
                predicted_output_tokens=op.out,
                predicted_output_p90=op.out * 1.4,
                produced_tokens=op.produced,
            )
            queue.push(req, n, frozenset(), now)
            waiting[req.id] = req
        elif isinstance(op, Advance):
            now += op.seconds
        elif isinstance(op, Refit):
            speeds[op.endpoint % len(speeds)] = op.speed
        elif isinstance(op, Tick):
            views = tuple(
                dataclasses.replace(view(f"e{i}"), estimates=EndpointEstimates(perf=perf(s)))
                for i, s in enumerate(speeds)
            )
            snap = FleetSnapshot(now=now, endpoints=views)
            expected = {
                rid
                for rid, req in waiting.items()
                if walking.recheck(req, scoped(snap, req, op.scope)).outcome is not AdmitOutcome.ADMIT
            }
            looked, after = ticks.due(queue, M, now, WAIT_LIMIT, admitter=scheduled, snap=snap)
            refused = set()
            for item in looked:
                decision = scheduled.recheck(item.req, scoped(snap, item.req, op.scope))
                if decision.outcome is AdmitOutcome.ADMIT:
                    queue.checks.again(item, after(item))
                else:
                    refused.add(item.req.id)
                    queue.remove(item)
            assert refused == expected, (now, speeds)
            for rid in refused:
                del waiting[rid]


@settings(max_examples=400, deadline=None)
@given(
    fleet=st.lists(st.sampled_from((0.5, 1.0, 1.02, 2.0)), min_size=1, max_size=3),
    refit=st.lists(st.sampled_from((0.5, 0.96, 0.98, 1.0, 1.01, 1.04, 2.0)), min_size=1, max_size=3),
    ttft_ms=st.sampled_from((None, 700.0, 3000.0)),
    deadline_ms=st.sampled_from((None, 6000.0, 25000.0)),
    prompt=st.sampled_from((10, 900, 5000)),
    out=st.sampled_from((1.0, 60.0, 400.0, 1200.0)),
    kept_at=st.floats(0.0, 1.0),
    later=st.floats(0.0, 1.2),
)
def test_a_refit_between_two_ticks_brings_a_kept_request_back_when_it_must(  # noqa: PLR0917
    fleet: list[float],
    refit: list[float],
    ttft_ms: float | None,
    deadline_ms: float | None,
    prompt: int,
    out: float,
    kept_at: float,
    later: float,
) -> None:
    """One request: a tick keeps it inside its window (past the bound with headroom, before the exact
    one), the fleet is refitted, and a second tick comes anywhere up to a little past the old promise:
    it is looked at exactly when a recheck would refuse it."""
    admitter = SloFeasibilityAdmitter(SloFeasibilityParams(recheck="late"), default_slo_policy())
    req = SchedRequest(
        id=RequestId("r1"),
        model=M,
        api=ApiKind.CHAT,
        arrival=0.0,
        slo=SLO(ttft_ms=ttft_ms, deadline_ms=deadline_ms),
        prompt_tokens=prompt,
        max_tokens=None,
        stream=True,
        predicted_output_tokens=out,
        predicted_output_p90=out * 1.4,
    )

    def snap(now: float, speeds: list[float]) -> FleetSnapshot:
        views = tuple(
            dataclasses.replace(view(f"e{i}"), estimates=EndpointEstimates(perf=perf(s)))
            for i, s in enumerate(speeds)
        )
        return FleetSnapshot(now=now, endpoints=views)

    queue = ModelQueue()
    queue.push(req, 0, frozenset(), 0.0)
    base = snap(0.0, fleet)
    admitter.recheck_epoch(M, base)
    admitter.recheck_next_epoch(M, base)
    start, end = admitter.recheck_from(req, base), admitter.recheck_next(req, base)
    if not (0.0 <= start < end < WAIT_LIMIT):
        return
    t1 = start + kept_at * (end - start)
    first = snap(t1, fleet)
    if admitter.recheck(req, first).outcome is not AdmitOutcome.ADMIT:
        return
    looked, after = ticks.due(queue, M, t1, WAIT_LIMIT, admitter=admitter, snap=first)
    assert [q.req for q in looked] == [req]
    queue.checks.again(looked[0], after(looked[0]))
    t2 = t1 + later * (end - t1)
    second = snap(t2, refit)
    refused = admitter.recheck(req, second).outcome is not AdmitOutcome.ADMIT
    looked, _ = ticks.due(queue, M, t2, WAIT_LIMIT, admitter=admitter, snap=second)
    if refused:
        assert [q.req for q in looked] == [req]
