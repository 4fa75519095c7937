"""SLO admission's late recheck keeps a queued request's idle terms (`IdleTerms`: prompt, planned output,
deadlines) and the ready endpoints of a snapshot between the questions it is asked: a warm admitter,
asked about the same requests on arrival and on tick after tick (their admission, their recheck, their
due time, their next promise, requeued copies of them), answers what an admitter that never saw them
answers and gives the times an admitter that keeps no terms gives (hypothesis), and the terms give the
latest start and time left of the plain functions. The tick's per-type `RecheckFrom` check agrees with
the protocol's isinstance."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.slo import Infeasible, SloClass, SloPolicy
from gateway.core.types import EndpointHealth
from gateway.sched.idle import IdleBound, IdleTerms, latest_start, output_bound
from gateway.sched.interfaces import AdmitDecision, RecheckFrom
from gateway.sched.plugins.admission.admit_all import AdmitAll, AdmitAllParams
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter, SloFeasibilityParams
from gateway.sched.request import SchedRequest
from gateway.sched.running import resume_prompt_tokens
from gateway.sched.snapshot import EndpointEstimates, FleetSnapshot
from gateway.sched.targets import time_left
from gateway.sched.ticks import promising
from tests.unit.sched_builders import view
from tests.unit.test_sched_ticks import M, perf, request

SLO = SloPolicy(classes={"c": SloClass("c", on_infeasible=Infeasible.REJECT)}, default_class="c")


def admitter(tail: str) -> SloFeasibilityAdmitter:
    params = SloFeasibilityParams(tail=tail, recheck="late")  # type: ignore[arg-type]  # a sampled literal
    return SloFeasibilityAdmitter(params, SLO)


def fleet(now: float, speeds: list[float], ready: int) -> FleetSnapshot:
    views = tuple(
        dataclasses.replace(
            view(f"e{i}", health=EndpointHealth.READY if i < ready else EndpointHealth.UNHEALTHY),
            estimates=EndpointEstimates(perf=perf(s)),
        )
        for i, s in enumerate(speeds)
    )
    return FleetSnapshot(now=now, endpoints=views)


def answer(d: AdmitDecision) -> tuple[object, ...]:
    return (d.outcome, d.reason, d.message, d.retry_after_s)


reqs = st.lists(
    st.tuples(
        st.sampled_from((None, 100.0, 500.0, 2000.0)),  # ttft_ms
        st.sampled_from((None, 1000.0, 5000.0, 30000.0)),  # deadline_ms
        st.sampled_from((1, 300, 4000)),  # prompt
        st.sampled_from((1.0, 40.0, 900.0)),  # predicted output
        st.sampled_from((0, 30)),  # produced by earlier runs
        st.floats(0.0, 3.0),  # arrival
    ),
    min_size=1,
    max_size=6,
)
ticks = st.lists(
    st.tuples(
        st.floats(0.0, 40.0),  # clock
        st.lists(st.sampled_from((0.5, 0.9, 1.0, 1.1, 2.0)), min_size=1, max_size=4),  # fleet speeds
        st.integers(0, 4),  # ready endpoints
        st.integers(0, 5),  # a request demoted (a new object with its id) before this tick
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(specs=reqs, script=ticks, tail=st.sampled_from(("mean", "normal", "cantelli")))
def test_a_warm_late_recheck_answers_what_a_fresh_admitter_answers(
    specs: list[tuple[float | None, float | None, int, float, int, float]],
    script: list[tuple[float, list[float], int, int]],
    tail: str,
) -> None:
    warm = admitter(tail)
    # asked the same questions, with nothing kept from one to the next (its epochs are the warm one's)
    cold = admitter(tail)
    queued: list[SchedRequest] = [
        dataclasses.replace(
            request(f"r{i}", arrival, ttft_ms=ttft, deadline_ms=e2e, prompt=prompt, out=out),
            produced_tokens=produced,
        )
        for i, (ttft, e2e, prompt, out, produced, arrival) in enumerate(specs)
    ]
    first = fleet(script[0][0], script[0][1], script[0][2])
    for req in queued:  # arrivals: the warm admitter keeps the terms of those that wait
        assert answer(warm.admit(req, first, lambda _: 0)) == answer(
            admitter(tail).admit(req, first, lambda _: 0)
        )
        warm.waiting(req)
    for now, speeds, ready, demote in script:
        if demote < len(queued):  # the same id, another object (a requeued preempted request)
            queued[demote] = dataclasses.replace(
                queued[demote], produced_tokens=queued[demote].produced_tokens + 7
            )
        snap = fleet(now, speeds, ready)
        scoped = dataclasses.replace(snap, endpoints=snap.endpoints[: max(1, len(speeds) // 2)])
        for part in (snap, scoped, snap):  # the whole fleet, a part a scope cut, the whole again
            for a in (warm, cold):
                a.recheck_epoch(M, part)
                a.recheck_next_epoch(M, part)
            for req in queued:
                assert answer(warm.recheck(req, part)) == answer(admitter(tail).recheck(req, part))
                for ask in ("recheck_from", "recheck_next"):
                    cold._terms.clear()
                    assert getattr(warm, ask)(req, part) == getattr(cold, ask)(req, part)


@settings(max_examples=300, deadline=None)
@given(
    spec=reqs,
    coefs=st.tuples(*(st.floats(-0.01, 0.5) for _ in range(5))),
    gamma=st.sampled_from((0.0, 1.0, 1.64)),
    alone=st.floats(1.0, 1.5),
    now=st.floats(0.0, 50.0),
)
def test_idle_terms_give_the_plain_latest_start_and_time_left(
    spec: list[tuple[float | None, float | None, int, float, int, float]],
    coefs: tuple[float, float, float, float, float],
    gamma: float,
    alone: float,
    now: float,
) -> None:
    bound = IdleBound(*coefs)
    for i, (ttft, e2e, prompt, out, produced, arrival) in enumerate(spec):
        req = dataclasses.replace(
            request(f"r{i}", arrival, ttft_ms=ttft, deadline_ms=e2e, prompt=prompt, out=out),
            produced_tokens=produced,
        )
        terms = IdleTerms.of(req, gamma)
        plain = latest_start(req, bound, float(resume_prompt_tokens(req)), output_bound(req, gamma), alone)
        assert terms.latest_start(bound, alone) == plain
        assert terms.left(now) == time_left(req, now)


def test_the_ticks_recheck_from_check_is_the_protocols() -> None:
    slo = admitter("mean")
    assert isinstance(slo, RecheckFrom)
    assert promising(slo) is slo
    plain = AdmitAll(AdmitAllParams(), SLO)
    assert promising(plain) is None
    assert promising(plain) is None  # (the second answer comes from the kept one)
    assert not isinstance(plain, RecheckFrom)
