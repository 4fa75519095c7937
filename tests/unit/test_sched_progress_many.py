"""`Fleet.progress_many` (the fleet simulator hands a burst of progress reports over in one call) leaves
the fleet exactly as the same reports one by one through `progress` (hypothesis over random reports,
bursts and cap changes between them)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import SLO, ApiKind, EndpointId, EngineKind, ModelName, RequestId
from gateway.sched.fleet import Fleet, Progress
from gateway.sched.request import SchedRequest
from gateway.sched.types import EndpointSpec

STALE_S = 2.0
M = ModelName("m")

#: a report: (request index, tokens, first token's offset, time step); None: a cap change between bursts
_reports = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 9), st.integers(0, 80), st.sampled_from([None, 0.0, 0.5]), st.floats(0, 1)),
        st.none(),
    ),
    max_size=50,
)


def _fleet(n: int, requests: int) -> Fleet:
    fleet = Fleet()
    fleet.sync(
        [EndpointSpec(EndpointId(f"e{i}"), f"http://e{i}", EngineKind.VLLM, frozenset({M})) for i in range(n)]
    )
    for k in range(requests):
        req = SchedRequest(RequestId(f"r{k}"), M, ApiKind.CHAT, 0.0, SLO(), 10, 32, True, None, 20.0, 30.0)
        fleet.dispatch(EndpointId(f"e{k % n}"), req, 0.0)
    return fleet


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 3), requests=st.integers(0, 8), reports=_reports)
def test_a_burst_of_reports_equals_the_reports_one_by_one(
    n: int, requests: int, reports: list[tuple[int, int, float | None, float] | None]
) -> None:
    one, many = _fleet(n, requests), _fleet(n, requests)
    now = 0.0
    burst: list[Progress] = []
    for i, r in enumerate([*reports, None]):
        if r is None:  # the burst ends: something else reaches the scheduler (here a cap change)
            many.progress_many(burst)
            burst = []
            eid = EndpointId(f"e{i % n}")
            for fleet in (one, many):
                fleet.set_cap(eid, 1 + i % 5, now)
            continue
        k, tokens, first, step = r
        now += step
        report = (RequestId(f"r{k}"), tokens, None if first is None else now - first, now)
        one.progress(*report)
        burst.append(report)
    assert one.views(now, STALE_S) == many.views(now, STALE_S)
