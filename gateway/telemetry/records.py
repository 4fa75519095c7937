"""The plain records telemetry takes in: a finished request (built by the finish phase), a scrape sample
(built by the scrape sink), and the settings it runs with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from gateway.core.slo import Allotment
from gateway.core.types import SLO, EndpointId, RequestId
from gateway.sched.perf import PerfCoefficients
from gateway.telemetry.perfmodel import PARTS, Part
from gateway.telemetry.promtext import Histogram

Quantity = Literal["ttft", "itl"]


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    prior: PerfCoefficients
    min_observations: int = 20  # per model part, before a refit replaces its fitted coefficients
    # per model part still holding the prior, before its first fit replaces it (None: min_observations)
    first_fit_min_observations: int | None = None
    # the parts whose prior is a guess (the built-in one): only those get the first fit early
    guessed_parts: frozenset[Part] = frozenset(PARTS)
    fit_window: int = 2000  # observations kept per model part
    kv_capacity_tokens: float | None = None  # when the engine does not export it
    crosscheck_min_samples: int = 20
    disagreement_tolerance: float = 2.0  # gateway/engine mean ratio beyond [1/t, t] is a disagreement
    attainment_window_s: float = 60.0


class FinishedRequest(NamedTuple):
    """One finished request, as plain numbers (clock seconds). A NamedTuple: the finish phase makes one
    per request, and a tuple is the cheapest immutable record to build."""

    model: str  # the served name
    task_class: str
    slo: SLO
    ok: bool
    stream: bool
    endpoint: EndpointId | None
    attempts: int
    arrival: float
    dispatched_at: float | None
    first_token_at: float | None
    finished_at: float
    prompt_chars: int
    prompt_tokens: int | None  # as the engine reported it (usage); None when it did not
    prompt_tokens_est: int  # the gateway's estimate at admission
    output_tokens: int
    gaps: Sequence[float]  # inter-token gaps of a stream
    predicted_output_tokens: float | None
    request: RequestId | None = None  # the scheduler's id (the autoscaler matches it to open calls)
    allotment: Allotment | None = None  # a task call's own share of its task SLA (the autoscaler's)
    # Prompt tokens the prefix index predicted cached on its endpoint at dispatch (the prefill fit
    # learns from the rest, corrected by the engine's hit counters).
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ScrapeSample:
    running: float | None
    kv_usage: float | None  # fraction 0..1
    kv_capacity_tokens: float | None  # from the engine's page; None: not exported
    ttft: Histogram | None  # the engine's cumulative histograms
    itl: Histogram | None
    gateway_inflight: int
    gateway_context_tokens: float  # the sum of contexts of the requests the gateway runs there
