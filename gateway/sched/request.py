"""What the scheduler knows about one request."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.types import SLO, ApiKind, ModelName, RequestId


@dataclass(frozen=True, slots=True)
class SchedRequest:
    id: RequestId
    model: ModelName  # the engine's served name (aliases already resolved)
    api: ApiKind
    arrival: float  # clock seconds when the gateway received it
    slo: SLO
    prompt_tokens: int  # estimate until the engine reports usage
    max_tokens: int | None
    stream: bool
    task_id: str | None = None
