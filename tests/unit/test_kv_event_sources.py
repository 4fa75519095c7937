"""The fleet's precise sources: one subscriber task and store per publishing endpoint, following the
endpoint set; health passed on; the index sees a store only while it is usable; the metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.core.clock import FakeClock
from gateway.core.tasks import TaskSupervisor
from gateway.core.types import EndpointHealth, EndpointId, EngineKind
from gateway.lifecycle.kv_events import KvEventsCollector, KvEventSources
from gateway.sched.types import EndpointSpec
from gateway.telemetry.prefix_index import PrefixIndex

A, B = EndpointId("a:1"), EndpointId("b:1")


def spec(eid: EndpointId, kv: str | None) -> EndpointSpec:
    return EndpointSpec(id=eid, url=f"http://{eid}", engine=EngineKind.VLLM, models=frozenset(), kv_events=kv)


async def test_sources_follow_the_endpoint_set() -> None:
    sup = TaskSupervisor()
    sources = KvEventSources(clock=FakeClock(), supervisor=sup)
    try:
        sources.sync([spec(A, "tcp://127.0.0.1:1"), spec(B, None)])
        assert sup.names == ["kv-events:a:1"]
        store = sources.store(A)
        assert store is not None
        assert sources.store(B) is None
        assert sources.holder(A) is None  # not connected yet: the approximate source answers
        store.connected(0.0)
        assert sources.holder(A) is store
        sources.on_health(A, EndpointHealth.UNHEALTHY)
        assert sources.holder(A) is None
        sources.on_health(A, EndpointHealth.READY)
        assert sources.holder(A) is store

        sources.sync([spec(A, "tcp://127.0.0.1:1"), spec(B, None)])  # unchanged: kept
        assert sources.store(A) is store
        sources.sync([spec(A, "tcp://127.0.0.1:2")])  # another publisher: a fresh store
        assert sources.store(A) is not store
        sources.sync([spec(A, None)])
        assert sources.store(A) is None
        assert sup.names == []
    finally:
        await sup.close()


async def test_metrics_render_per_endpoint() -> None:
    sup = TaskSupervisor()
    sources = KvEventSources(clock=FakeClock(), supervisor=sup)
    try:
        sources.sync([spec(A, "tcp://127.0.0.1:1")])
        registry = CollectorRegistry()
        registry.register(KvEventsCollector(sources.statuses, sources.decode_errors))
        get = registry.get_sample_value
        assert get("berth_kv_events_source_state", {"endpoint": A, "state": "fallen_back"}) == 1.0
        assert get("berth_kv_events_source_state", {"endpoint": A, "state": "live"}) == 0.0
        assert get("berth_kv_events_blocks", {"endpoint": A}) == 0.0
        assert get("berth_kv_events_gaps_total", {"endpoint": A}) == 0.0
        assert get("berth_kv_events_decode_errors_total", {"endpoint": A}) == 0.0
    finally:
        await sup.close()


async def test_a_usable_store_is_attached_to_the_prefix_index() -> None:
    sup = TaskSupervisor()
    index = PrefixIndex()
    sources = KvEventSources(clock=FakeClock(), supervisor=sup, index=index)
    try:
        sources.sync([spec(A, "tcp://127.0.0.1:1")])
        store = sources.store(A)
        assert store is not None
        assert index.source(A) == "approximate"
        store.connected(0.0)
        assert index.source(A) == "precise"
        store.disconnected(1.0)
        assert index.source(A) == "approximate"
        store.connected(2.0)
        sources.sync([])
        assert index.source(A) == "approximate"
    finally:
        await sup.close()
