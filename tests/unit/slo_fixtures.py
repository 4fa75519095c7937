"""Builders shared by the SLO-scheduling unit tests: endpoint views with a simple performance model and
running requests, and scheduler requests with targets."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from gateway.config.policy import parse_policy_text
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
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins import default_registry
from gateway.sched.profile import Policy
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetSnapshot

#: Round numbers: prefill 0.1 ms per prompt token + 10 ms; decode 1 ms per request + 10 ms per
#: iteration (k2 = 0: context does not matter); KV one token per context token.
COEF = PerfCoefficients(
    k1=1e-4, c1=0.01, k2=0.0, c2=0.001, c3=0.01, h=1.0, j=0.0, thr1=100.0, alpha=0.0, beta=0.0
)
#: Slower hardware than `COEF`, with context and KV terms: a fleet of two kinds of endpoint.
SLOW = PerfCoefficients(
    k1=2e-4, c1=0.02, k2=1e-6, c2=0.002, c3=0.012, h=1.0, j=8.0, thr1=1.0, alpha=0.0, beta=0.0
)
_REPO = Path(__file__).resolve().parents[2]


def columnar_preset(name: str) -> Policy:
    """The shipped preset `name`, placing over columns whatever the number of candidates."""
    text = (_REPO / "policies" / f"{name}.toml").read_text()
    policy = parse_policy_text(text, f"{name}.toml", default_registry())
    return dataclasses.replace(policy, profile=dataclasses.replace(policy.profile, columns_from=0))


def running(
    rid: str,
    *,
    dispatched_at: float = 0.0,
    prompt: int = 100,
    out: float = 50.0,
    std: float = 0.0,
    ttft_deadline: float | None = None,
    e2e_deadline: float | None = None,
    itl_s: float | None = None,
    best_effort: bool = False,
    cls: str = "c",
) -> RunningRequest:
    return RunningRequest(
        id=RequestId(rid),
        slo_class=cls,
        prompt_tokens=prompt,
        output_mean=out,
        output_std=std,
        max_tokens=None,
        dispatched_at=dispatched_at,
        ttft_deadline=ttft_deadline,
        e2e_deadline=e2e_deadline,
        itl_s=itl_s,
        best_effort=best_effort,
    )


def view(
    eid: str,
    *,
    model: str = "m",
    cap: int = 8,
    runs: Iterable[RunningRequest] = (),
    kv: float | None = None,
    coef: PerfCoefficients = COEF,
    health: EndpointHealth = EndpointHealth.READY,
    priority: bool = False,
) -> EndpointView:
    rs = tuple(runs)
    return EndpointView(
        id=EndpointId(eid),
        url=f"http://{eid}:8000",
        engine=EngineKind.VLLM,
        models=frozenset({ModelName(model)}),
        instance_class=InstanceClass.MIXED,
        health=health,
        cap=cap,
        inflight=len(rs),
        running=rs,
        estimates=EndpointEstimates(perf=coef, kv_capacity_tokens=kv),
        priority_scheduling=priority,
    )


def req(
    rid: str = "r",
    *,
    arrival: float = 0.0,
    prompt: int = 100,
    out: float | None = 50.0,
    ttft_ms: float | None = None,
    e2e_ms: float | None = None,
    itl_ms: float | None = None,
    cls: str = "c",
    best_effort: bool = False,
    model: str = "m",
) -> SchedRequest:
    return SchedRequest(
        id=RequestId(rid),
        model=ModelName(model),
        api=ApiKind.CHAT,
        arrival=arrival,
        slo=SLO(slo_class=cls, ttft_ms=ttft_ms, itl_ms=itl_ms, deadline_ms=e2e_ms),
        prompt_tokens=prompt,
        max_tokens=None,
        stream=True,
        predicted_output_tokens=out,
        predicted_output_p90=out,
        best_effort=best_effort,
    )


def snap(*views: EndpointView, now: float = 0.0) -> FleetSnapshot:
    return FleetSnapshot(now=now, endpoints=tuple(views))
