"""The fleet's tuple of endpoint views, kept and patched per changed endpoint, always equals each
endpoint's own view as of now (hypothesis over random event sequences); a progress report's copy of a
running request carries every other field; the records built positionally (a view, a running request)
hold each value under its own name."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import (
    SLO,
    ApiKind,
    EndpointHealth,
    EndpointId,
    EngineGauges,
    EngineKind,
    InstanceClass,
    ModelName,
    RequestId,
)
from gateway.sched.fleet import Fleet
from gateway.sched.load_terms import same_requests
from gateway.sched.request import SchedRequest
from gateway.sched.running import (
    RunningRequest,
    deadlines,
    output_estimate,
    remaining_max_tokens,
    resume_prompt_tokens,
    running_from,
    with_progress,
)
from gateway.sched.snapshot import EndpointEstimates, EndpointView
from gateway.sched.types import EndpointSpec, PeerLoad

STALE_S = 2.0
M = ModelName("m")


def _spec(i: int, cap: int | None = None) -> EndpointSpec:
    return EndpointSpec(EndpointId(f"e{i}"), f"http://e{i}", EngineKind.VLLM, frozenset({M}), cap=cap)


def _req(n: int, now: float) -> SchedRequest:
    return SchedRequest(RequestId(f"r{n}"), M, ApiKind.CHAT, now, SLO(), 10, 32, True, None, 20.0, 30.0)


_events = st.lists(
    st.one_of(
        st.tuples(st.just("dispatch"), st.integers(0, 5)),
        st.tuples(st.just("complete"), st.integers(0, 50)),
        st.tuples(st.just("progress"), st.integers(0, 50)),
        st.tuples(st.just("health"), st.integers(0, 5)),
        st.tuples(st.just("gauges"), st.integers(0, 5)),
        st.tuples(st.just("cap"), st.integers(0, 5)),
        st.tuples(st.just("time"), st.integers(0, 3)),
        st.tuples(st.just("sync"), st.integers(1, 6)),
        st.tuples(st.just("view"), st.integers(0, 5)),
        st.tuples(st.just("peers"), st.integers(0, 5)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 6), events=_events)
def test_the_kept_views_equal_every_endpoints_own_view(n: int, events: list[tuple[str, int]]) -> None:
    fleet = Fleet()
    fleet.sync([_spec(i) for i in range(n)])
    now = 0.0
    running: list[RequestId] = []
    made = 0
    for kind, k in events:
        ids = fleet.ids()
        if kind == "dispatch" and ids:
            made += 1
            req = _req(made, now)
            fleet.dispatch(ids[k % len(ids)], req, now)
            running.append(req.id)
        elif kind == "complete" and running:
            fleet.complete(running.pop(k % len(running)))
        elif kind == "progress" and running:
            fleet.progress(running[k % len(running)], k, now, now)
        elif kind == "health" and ids:
            fleet.set_health(ids[k % len(ids)], EndpointHealth.READY if k % 2 else EndpointHealth.UNHEALTHY)
        elif kind == "gauges" and ids:
            fleet.observe_gauges(ids[k % len(ids)], EngineGauges(running=float(k), waiting=0.0), now)
        elif kind == "cap" and ids:
            fleet.set_cap(ids[k % len(ids)], k + 1)
        elif kind == "time":
            now += (0.5, 1.0, STALE_S, 3 * STALE_S)[k]
        elif kind == "sync":
            fleet.sync([_spec(i, cap=None if k % 2 else 16) for i in range(k)])
        elif kind == "peers" and ids:  # the other replicas' load (cluster mode)
            fleet.observe_peers({ids[k % len(ids)]: PeerLoad(k, 10 * k, float(k))} if k else {}, now)
        elif kind == "view" and ids:
            fleet.view(ids[k % len(ids)], now, STALE_S)  # a single endpoint's view, out of turn
        kept = fleet.views(now, STALE_S)
        own = tuple(fleet.view(eid, now, STALE_S) for eid in fleet.ids())
        assert kept == own


def test_a_progress_report_copies_every_other_field() -> None:
    r = RunningRequest(
        RequestId("r"), "c", 11, 12.5, 3.5, 40, 1.25, 2.5, 9.5, 0.05, True, True, 2, 7, 3, 1.75, 2.0, 5
    )
    assert len(dataclasses.fields(r)) == 19  # a new field must be carried by with_progress too
    assert with_progress(r, 7, 1.5, 2.5) == dataclasses.replace(
        r, produced=7, first_token_at=1.5, reported_at=2.5
    )
    # the memo of its kept fields (`kept`, no part of its value) is handed on too
    assert same_requests((r,), (dataclasses.replace(r),))
    assert r.kept is not None
    assert with_progress(r, 7, 1.5, 2.5).kept is r.kept


def test_a_view_names_every_field_of_its_endpoint() -> None:
    """The view is built positionally (it is remade on every dispatch and completion): each field must
    hold the endpoint's value of that name. Every runtime field is set to a value no other one has."""
    fleet = Fleet()
    spec = EndpointSpec(
        EndpointId("e0"),
        "http://e0",
        EngineKind.SGLANG,
        frozenset({M}),
        InstanceClass.BATCH,
        cap=None,
        node="n7",
        priority_scheduling=True,
        max_batch=48,
        config="tp2",
        default_cap=61,
    )
    fleet.sync([spec])
    fleet.set_health(spec.id, EndpointHealth.READY)
    fleet.observe_gauges(spec.id, EngineGauges(running=5.0, waiting=6.0, kv_usage=0.7), 100.0)
    estimates = EndpointEstimates(ttft_ewma_s=0.3)
    fleet.set_estimates(spec.id, estimates)
    req = _req(1, 100.0)
    fleet.dispatch(spec.id, req, 100.5)
    fleet.dispatch(spec.id, _req(2, 100.0), 100.6)
    fleet.complete(RequestId("r2"))
    fleet.progress(req.id, 5, 100.55, 100.6)  # 4 gaps before the cut
    fleet.set_cap(spec.id, 33, now=100.65)
    fleet.progress(req.id, 9, 100.55, 100.9)  # 4 more, from a report before the cut
    view = fleet.view(spec.id, 101.0, STALE_S)
    assert view is not None
    running = fleet.views(101.0, STALE_S)[0].running
    assert [r.id for r in running] == [req.id]
    expected = EndpointView(
        id=spec.id,
        url="http://e0",
        engine=EngineKind.SGLANG,
        models=frozenset({M}),
        instance_class=InstanceClass.BATCH,
        health=EndpointHealth.READY,
        cap=33,
        inflight=1,
        engine_running=5.0,
        engine_waiting=6.0,
        kv_usage=0.7,
        dispatched_since_scrape=2,
        scraped_at=100.0,
        node="n7",
        completed_since_scrape=1,
        running_prompt_tokens=10,
        running_output_tokens=20.0,
        estimates=estimates,
        running=running,
        priority_scheduling=True,
        max_cap=48,
        streamed_tokens=9,
        gap_s=0.0 + (100.6 - 100.55) + (100.9 - 100.6),
        gap_tokens=8,
        cut_at=100.65,
        gap_after_cut_s=0.0 + (100.6 - 100.55),
        gap_after_cut_tokens=4,
        max_batch=48,
        config="tp2",
    )
    assert len(dataclasses.fields(EndpointView)) == 29  # a new field must be set in `EndpointState.view`
    assert view == expected


def test_a_running_request_names_every_field_of_its_request() -> None:
    """`running_from` builds positionally: each field holds what the helpers of its name work out."""
    req = SchedRequest(
        RequestId("r"),
        M,
        ApiKind.CHAT,
        10.0,
        SLO("c", ttft_ms=500.0, itl_ms=40.0, deadline_ms=9000.0),
        100,
        300,
        True,
        None,
        120.0,
        180.0,
        best_effort=True,
        resumable=True,
        preemptions=2,
        produced_tokens=0,
    )
    mean, std = output_estimate(req)
    ttft, e2e = deadlines(req)
    assert running_from(req, 12.0) == RunningRequest(
        id=req.id,
        slo_class="c",
        prompt_tokens=resume_prompt_tokens(req),
        output_mean=mean,
        output_std=std,
        max_tokens=remaining_max_tokens(req),
        dispatched_at=12.0,
        ttft_deadline=ttft,
        e2e_deadline=e2e,
        itl_s=0.04,
        best_effort=True,
        resumable=True,
        preemptions=2,
        produced_before=0,
    )
