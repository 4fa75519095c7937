"""Turn a validated request into the scheduler's view of it.

Prompt tokens are estimated without a tokenizer (characters / 4) until the telemetry issue calibrates
the ratio per model from the usage engines report. The SLO is the policy's default class for now; the
SLO issue resolves it from headers, tenant and policy rules.
"""

from __future__ import annotations

from gateway.core.types import SLO, ModelName, RequestId
from gateway.front.schemas import ParsedRequest
from gateway.sched.request import SchedRequest

CHARS_PER_TOKEN = 4.0
_DEFAULT_SLO = SLO()


def to_sched_request(rid: str, parsed: ParsedRequest, served: ModelName, arrival: float) -> SchedRequest:
    return SchedRequest(
        id=RequestId(rid),
        model=served,
        api=parsed.api,
        arrival=arrival,
        slo=_DEFAULT_SLO,
        prompt_tokens=max(1, int(parsed.prompt_chars / CHARS_PER_TOKEN)),
        max_tokens=parsed.max_tokens,
        stream=parsed.stream,
    )
