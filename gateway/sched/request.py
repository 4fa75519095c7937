"""What the scheduler knows about one request."""

from __future__ import annotations

from gateway.core.frozen import frozen
from gateway.core.slo import Allotment
from gateway.core.types import SLO, ApiKind, ModelName, RequestId
from gateway.sched.prefix import NO_HITS, PrefixHits


@frozen
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
    # Preemption (gateway.sched.interfaces.Preemptor): whether the front can resume the request faithfully
    # after its engine request is aborted (only such requests may be victims; the simulator sets it True);
    # how often it was preempted so far; and the output tokens its earlier runs produced before they were
    # preempted (predictions of its remaining output subtract them; a resumed run re-sends them as prompt).
    resumable: bool = False
    preemptions: int = 0
    produced_tokens: int = 0
    # A task call's own share of its task SLA (CATO's allotted time for its step; `slo` holds the rest of
    # the task SLA as its deadline): what slack violations are counted against. None: not a task call.
    allotment: Allotment | None = None
    # Prompt tokens each endpoint is predicted to hold in its prefix cache (the prefix index, looked up
    # once at admission): predictions charge prefill on the rest only (gateway.sched.prefix).
    cached: PrefixHits = NO_HITS
