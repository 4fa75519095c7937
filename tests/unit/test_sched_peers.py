"""Cluster mode in the sans-IO core: the other replicas' published load (a value handed to the
scheduler) is added to each endpoint's view, so placement and the concurrency cap see the endpoint's
whole load; load that goes away serves the queue; a replica publishes only its own."""

from __future__ import annotations

from gateway.config.policy import load_default_policy
from gateway.core.clock import FakeClock
from gateway.core.types import SLO, ApiKind, EndpointHealth, EndpointId, EngineKind, ModelName, RequestId
from gateway.sched.decisions import Dispatch
from gateway.sched.plugins import default_registry
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import EndpointSpec, PeerLoad

M = ModelName("m")
E1, E2 = EndpointId("e1"), EndpointId("e2")


def _sched(cap: int = 4) -> Scheduler:
    s = Scheduler(load_default_policy(default_registry()), FakeClock(0.0))
    specs = [EndpointSpec(e, f"http://{e}", EngineKind.VLLM, frozenset({M}), cap=cap) for e in (E1, E2)]
    s.sync_endpoints(specs)
    for e in (E1, E2):
        s.set_health(e, EndpointHealth.READY)
    return s


def _req(n: int) -> SchedRequest:
    return SchedRequest(RequestId(f"r{n}"), M, ApiKind.CHAT, 0.0, SLO(), 10, 32, True, None, 20.0, 30.0)


def test_peers_load_is_added_to_the_view_and_own_load_is_published_alone() -> None:
    s = _sched()
    d = s.submit(_req(1))
    assert isinstance(d, Dispatch)
    mine = d.endpoint.id
    s.observe_peers({mine: PeerLoad(3, 300, 30.0)})
    view = s.endpoint_view(mine)
    assert view is not None
    assert view.inflight == 4
    assert view.running_prompt_tokens == 310
    assert s.inflight_on(mine) == 1  # the gateway's own count stays its own
    assert s.own_loads() == {mine: PeerLoad(1, 10, view.running_output_tokens - 30.0)}


def test_placement_avoids_the_endpoint_the_other_replicas_fill() -> None:
    s = _sched()
    s.observe_peers({E1: PeerLoad(3, 300, 30.0)})
    d = s.submit(_req(1))
    assert isinstance(d, Dispatch)
    assert d.endpoint.id == E2


def test_the_cap_counts_the_peers_and_their_leaving_serves_the_queue() -> None:
    s = _sched(cap=2)
    s.observe_peers({E1: PeerLoad(2, 0, 0.0), E2: PeerLoad(2, 0, 0.0)})
    assert s.submit(_req(1)) is None  # every endpoint full with the other replicas' requests: it waits
    assert s.queue_depth(M) == 1
    out = s.observe_peers({E1: PeerLoad(1, 0, 0.0), E2: PeerLoad(2, 0, 0.0)})
    assert [d.endpoint.id for d in out if isinstance(d, Dispatch)] == [E1]


def test_no_peers_is_the_local_view() -> None:
    s = _sched()
    s.observe_peers({E1: PeerLoad(3, 0, 0.0)})
    s.observe_peers({})  # Redis down: the local view
    view = s.endpoint_view(E1)
    assert view is not None
    assert view.inflight == 0
