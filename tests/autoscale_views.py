"""Views for the autoscale tests: instances and models built by hand, with defaults that read well."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.core.slo import SloKind
from gateway.core.types import InstanceClass, ModelName, RequestId
from gateway.sched.plugins.autoscale.interface import (
    FinishedCall,
    InstanceView,
    ModelScaleView,
    OpenCall,
    QueuedRequest,
    ScaleState,
    ScaleView,
)

M = ModelName("m")


def inst(  # noqa: PLR0917  # a test table's row
    iid: str,
    cls: InstanceClass = InstanceClass.MIXED,
    state: ScaleState = ScaleState.READY,
    interactive: int = 0,
    batch: int = 0,
    cap: int | None = 16,
    idle_since: float | None = None,
    tokens_per_s: float | None = None,
    ready_at: float | None = 0.0,
    created_at: float = 0.0,
    model: ModelName = M,
) -> InstanceView:
    busy = interactive + batch > 0
    return InstanceView(
        id=iid,
        model=model,
        instance_class=cls,
        config=None,
        devices=1,
        state=state,
        created_at=created_at,
        ready_at=ready_at if state is ScaleState.READY else None,
        running_interactive=interactive,
        running_batch=batch,
        cap=cap if state is ScaleState.READY else None,
        idle_since=None if busy else (idle_since if idle_since is not None else 0.0),
        endpoint=None,
        tokens_per_s=tokens_per_s,
    )


def queued(
    kind: SloKind, n: int, *, deadline: float | None = None, tokens: float = 100.0
) -> list[QueuedRequest]:
    return [QueuedRequest(kind, 0.0, deadline, tokens, 0.0) for _ in range(n)]


def open_call(rid: str, took: float | None, allotted: float | None = 1.0) -> OpenCall:
    """An interactive call not finished yet that has taken `took` s so far of its `allotted` s."""
    return OpenCall(RequestId(rid), SloKind.INTERACTIVE, 0.0, allotted, took)


def model(  # a test table's row
    instances: Sequence[InstanceView],
    queue: Sequence[QueuedRequest] = (),
    *,
    finished: Sequence[FinishedCall] = (),
    open_calls: Sequence[OpenCall] = (),
    rate: float = 0.0,
    lo: int = 0,
    hi: int = 50,
    load_s: float = 30.0,
    name: ModelName = M,
) -> ModelScaleView:
    return ModelScaleView(
        model=name,
        instances=tuple(instances),
        queued=tuple(queue),
        finished=tuple(finished),
        arrival_rate=rate,
        min_instances=lo,
        max_instances=hi,
        devices_per_instance=1,
        load_s=load_s,
        open_calls=tuple(open_calls),
    )


def view(*models: ModelScaleView, now: float = 100.0, free: int = 50) -> ScaleView:
    return ScaleView(now=now, models={m.model: m for m in models}, free_devices=free)
