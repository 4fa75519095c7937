"""Turn a validated request into the scheduler's view of it.

Prompt tokens are the engine's exact count when the gateway asked for one (`[telemetry] prompt_tokens =
"tokenize"`, see `gateway.admission.prompt_tokens`); otherwise they are estimated without a tokenizer,
from the prompt's characters and the characters per token calibrated per model from the usage engines
report (`TokenEstimator`); without one, characters / 4.
The output length is predicted per model and task class (`OutputLengthPredictor`). The SLO comes
resolved (`gateway.admission.slo`: headers, tenant, policy rules, then the policy's default class).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.core.slo import Allotment
from gateway.core.types import SLO, ApiKind, ModelName, ParsedRequest, RequestId
from gateway.sched.prefix import NO_HITS, PrefixHits
from gateway.sched.request import SchedRequest
from gateway.telemetry.lengths import LengthPrediction
from gateway.telemetry.tokens import TokenEstimator
from gateway.upstream.resume import resumable

CHARS_PER_TOKEN = 4.0
_DEFAULT_SLO = SLO()


class LengthPredictor(Protocol):
    """`OutputLengthPredictor`, or the daemon's cache in front of it."""

    def predict(
        self, model: str, task_class: str, prompt_tokens: int, max_tokens: int | None
    ) -> LengthPrediction: ...


def task_class(slo: SLO) -> str:
    """The class output lengths are predicted by: the SLO class, since classes are the task types
    (completion, chat, batch, ...) whose output lengths differ."""
    return slo.slo_class


def to_sched_request(
    rid: str,
    parsed: ParsedRequest,
    served: ModelName,
    arrival: float,
    *,
    tokens: TokenEstimator | None = None,
    lengths: LengthPredictor | None = None,
    slo: SLO | None = None,
    task_id: str | None = None,
    allotment: Allotment | None = None,
    prompt_tokens: int | None = None,
    preemptive: bool = False,
    stream_unstreamed: bool = False,
    cached: Callable[[int], PrefixHits] | None = None,
) -> SchedRequest:
    """`slo`: as resolved (gateway.admission.slo); None: the default SLO without targets.
    `prompt_tokens`: the engine's count of the prompt; None: estimate it. `preemptive`: the policy may
    preempt (otherwise no request is marked resumable, and none pays for the check).
    `stream_unstreamed`: a non-streamed request will be streamed from the engine (so it may be
    resumed, see gateway.upstream.resume). `allotment`: a task call's own share of its task SLA.
    `cached`: the prefix index's lookup of this prompt, given its prompt tokens (cached tokens per
    endpoint, `gateway.telemetry.prefix_index`); None: nothing known to be cached."""
    slo = slo or _DEFAULT_SLO
    if prompt_tokens is not None:
        prompt = max(1, prompt_tokens)
    elif tokens is not None:
        prompt = max(1, tokens.estimate(served, parsed.prompt_chars))
    else:
        prompt = max(1, int(parsed.prompt_chars / CHARS_PER_TOKEN))
    predicted: float | None = None
    p90: float | None = None
    if parsed.api is ApiKind.EMBEDDING:
        predicted = p90 = 0.0  # an embedding generates nothing
    elif lengths is not None:
        pred = lengths.predict(served, task_class(slo), prompt, parsed.max_tokens)
        predicted, p90 = pred.mean, pred.p90
    # Positional, in field order (one is made per request; keywords cost time to match).
    return SchedRequest(
        RequestId(rid),
        served,  # model
        parsed.api,
        arrival,
        slo,
        prompt,  # prompt_tokens
        parsed.max_tokens,
        parsed.stream,
        task_id,
        predicted,  # predicted_output_tokens
        p90,  # predicted_output_p90
        False,  # best_effort
        preemptive and (parsed.stream or stream_unstreamed) and resumable(parsed.api, parsed.body),
        0,  # preemptions
        0,  # produced_tokens
        allotment,
        NO_HITS if cached is None else cached(prompt),
    )
