"""The fleet's tuple of endpoint views, kept and patched per changed endpoint, always equals each
endpoint's own view as of now (hypothesis over random event sequences); a progress report's copy of a
running request carries every other field."""

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
    ModelName,
    RequestId,
)
from gateway.sched.fleet import Fleet
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest, with_progress
from gateway.sched.types import EndpointSpec

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
        elif kind == "view" and ids:
            fleet.view(ids[k % len(ids)], now, STALE_S)  # a single endpoint's view, out of turn
        kept = fleet.views(now, STALE_S)
        own = tuple(fleet.view(eid, now, STALE_S) for eid in fleet.ids())
        assert kept == own


def test_a_progress_report_copies_every_other_field() -> None:
    r = RunningRequest(
        RequestId("r"), "c", 11, 12.5, 3.5, 40, 1.25, 2.5, 9.5, 0.05, True, True, 2, 7, 3, 1.75, 2.0
    )
    assert len(dataclasses.fields(r)) == 17  # a new field must be carried by with_progress too
    assert with_progress(r, 7, 1.5, 2.5) == dataclasses.replace(
        r, produced=7, first_token_at=1.5, reported_at=2.5
    )
