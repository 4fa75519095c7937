"""How far off the prior is on one endpoint, from what its running requests already show (sans-IO).

The performance model's parts are fitted from the settled token timeline (`gateway.telemetry.timeline`),
which waits for the oldest request running on an endpoint to finish: on a busy endpoint of long answers
the first fit comes 15-20 s after the first request. Until then the prior predicts, and the built-in
prior is an A100 (`gateway.sched.perf.default_prior`), several times faster than most self-hosted
hardware: placement and admission would be optimistic exactly while the fleet fills up. The requests
running there tell more within a second (the relay's progress reports, `RunningRequest`):

- decode: a request's per-token time so far, ``(reported_at − first_token_at) / (produced − 1)``,
  against the prior's decode iteration at the endpoint's current batch and mean context; the median
  over the requests that have one (prefill pauses of new arrivals are included: a little cautious);
- prefill: a request's time from dispatch to its first token against the prior's prefill of its
  prompt; the least over the requests (the others also waited for a seat or an iteration in flight).

Each factor is at least 1: the reading only ever makes the prior more cautious, never faster than it
(a machine faster than the prior waits for its fit, which is the safe side). None: nothing to read.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from gateway.sched.perf import PerfCoefficients
from gateway.sched.running import RunningRequest


def prior_factors(
    prior: PerfCoefficients, running: Sequence[RunningRequest]
) -> tuple[float | None, float | None]:
    """(prefill, decode) factors of `prior`'s times seen on an endpoint running `running`."""
    n = len(running)
    if not n:
        return None, None
    avg_ctx = sum(r.prompt_tokens + (r.produced or 0) for r in running) / n
    iteration = prior.decode_iter_s(n, avg_ctx)
    decode: list[float] = []
    prefill: list[float] = []
    for r in running:
        first = r.first_token_at
        if first is None:
            continue
        pre = prior.prefill_s(r.prompt_tokens)
        if first > r.dispatched_at and pre > 0:
            prefill.append((first - r.dispatched_at) / pre)
        produced, at = r.produced, r.reported_at
        if produced is not None and produced >= 2 and at is not None and at > first and iteration > 0:
            decode.append((at - first) / (produced - 1) / iteration)
    return (
        max(1.0, min(prefill)) if prefill else None,
        max(1.0, median(decode)) if decode else None,
    )
