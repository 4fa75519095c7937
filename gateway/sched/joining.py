"""What a request joining an endpoint costs the requests running there, in the fitted model's terms
(`EndpointLoad.harm` lists the harms; `gateway.sched.harms` answers yes/no on the same numbers)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from gateway.sched.perf import PerfCoefficients
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens, resume_prompt_tokens
from gateway.sched.snapshot import EndpointView


class Load(Protocol):
    """What of an endpoint's load (`gateway.sched.predict.EndpointLoad`) the delays need."""

    @property
    def coef(self) -> PerfCoefficients: ...
    @property
    def view(self) -> EndpointView: ...
    @property
    def overhead(self) -> float: ...
    def output_tokens(self, req: SchedRequest) -> float: ...


class JoinDelays(NamedTuple):
    first: float  # a running request still waiting for its first token waits this much longer (k1·p)
    pause: float  # every running decode pauses this long for the request's prefill
    per_iter: float  # each decode iteration both run is this much longer (k2·context + c2, with overhead)
    out: float  # the request's predicted output tokens (how many iterations it shares at most)


def join_delays(load: Load, req: SchedRequest) -> JoinDelays:
    """`req` joining `load`'s endpoint: its uncached prefill there, its context and output."""
    c = load.coef
    p = float(resume_prompt_tokens(req))
    fresh = prefill_tokens(req, load.view.id)
    out = load.output_tokens(req)
    per_iter = (c.k2 * (p + 0.5 * out) + c.c2) * (1.0 + load.overhead)
    return JoinDelays(c.k1 * fresh, c.prefill_s(fresh), per_iter, out)
