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
    # Output tokens predicted at admission (gateway.telemetry.lengths), capped by max_tokens; None: no
    # predictor ran (tests, the simulator without one).
    predicted_output_tokens: float | None = None
    predicted_output_p90: float | None = None
    # Admission demoted it to the lowest band: its SLO was infeasible and its class says best-effort.
    best_effort: bool = False
    # It can be preempted and resumed elsewhere without the client noticing (gateway.upstream.resume).
    resumable: bool = False
    preemptions: int = 0  # times it was preempted so far
    produced_tokens: int = 0  # output tokens streamed by runs before its last preemption
