"""Builders shared by the scheduler-core unit tests: endpoint views, requests and snapshots."""

from __future__ import annotations

from collections.abc import Iterable

from gateway.core.types import (
    SLO,
    ApiKind,
    EndpointHealth,
    EndpointId,
    EngineKind,
    InstanceClass,
    ModelName,
    RequestId,
)
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot


def view(
    eid: str,
    *,
    models: Iterable[str] = ("m",),
    health: EndpointHealth = EndpointHealth.READY,
    cap: int = 8,
    inflight: int = 0,
    waiting: float | None = None,
) -> EndpointView:
    """A mixed-class vLLM endpoint; `waiting` given means fresh engine gauges (0 running)."""
    return EndpointView(
        id=EndpointId(eid),
        url=f"http://{eid}:8000",
        engine=EngineKind.VLLM,
        models=frozenset(ModelName(m) for m in models),
        instance_class=InstanceClass.MIXED,
        health=health,
        cap=cap,
        inflight=inflight,
        engine_running=None if waiting is None else 0.0,
        engine_waiting=waiting,
    )


def request(rid: str = "r", model: str = "m", arrival: float = 0.0) -> SchedRequest:
    return SchedRequest(
        id=RequestId(rid),
        model=ModelName(model),
        api=ApiKind.CHAT,
        arrival=arrival,
        slo=SLO(),
        prompt_tokens=16,
        max_tokens=None,
        stream=False,
    )


def snapshot(*views: EndpointView, now: float = 0.0) -> FleetSnapshot:
    return FleetSnapshot(now=now, endpoints=views)
