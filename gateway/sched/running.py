"""What the scheduler remembers about each request it dispatched, per endpoint (see `EndpointView.running`).

A `RunningRequest` is made when the request is placed, from what admission knew: its prompt, its
predicted output (mean and spread), its targets as absolute clock deadlines; the dispatcher's progress
reports (tokens streamed so far) replace it with an updated copy. Placement plugins estimate
from it how far the request has got (`gateway.sched.predict`), what it still needs, and whether a new
request placed beside it would push it past its deadline.

How long one outlives its request: the endpoint's views hold the records of its running requests, and
the caches that keep views between decisions (the fleet's kept views, `LoadCache`, SLO admission's
endpoint orders and bounds, slack ordering's epoch, `unfit`'s last change, a queued request's unfit
memo) keep those they were last asked about until their next rebuild. A finished request's record, and
each copy a progress report superseded, stays reachable until then: a few tuples of views per cache (SLO
admission's endpoint orders up to 16) and one per queued request's memo (until it is tried again or
leaves the queue). So their number is bounded by the fleet and its queue, not by time: a standing queue
keeps a steady number alive, and a quiet gateway holds its last busy moment's records until traffic
rebuilds those caches (tests/unit/test_sched_running_retention.py).
"""

from __future__ import annotations

from dataclasses import field
from operator import attrgetter
from typing import Final

from gateway.core.frozen import frozen
from gateway.core.types import EndpointId, RequestId
from gateway.sched.prefix import uncached
from gateway.sched.request import SchedRequest

#: Output tokens assumed for a request with neither a prediction nor max_tokens.
DEFAULT_OUTPUT_TOKENS: Final = 256.0
#: The standard normal's 0.9 quantile: turns a predicted p90 into a standard deviation.
Z90: Final = 1.2815515655446004


@frozen
class RunningRequest:
    id: RequestId
    slo_class: str
    prompt_tokens: int
    output_mean: float  # predicted output tokens
    output_std: float
    max_tokens: int | None
    dispatched_at: float  # clock seconds
    ttft_deadline: float | None  # clock seconds by which the first token is due (None: no target)
    e2e_deadline: float | None  # ... the last token
    itl_s: float | None  # per-token target (seconds)
    best_effort: bool = False
    # What preemption needs to judge it as a victim (gateway.sched.request.SchedRequest's fields).
    resumable: bool = False
    preemptions: int = 0
    produced_before: int = 0  # output tokens of its earlier, preempted runs (not in `produced`)
    # Progress the dispatcher reported (Scheduler.progress): tokens streamed so far, when its first token
    # came and when the count was taken. None: not reported (estimated from time instead).
    produced: int | None = None
    first_token_at: float | None = None
    reported_at: float | None = None
    # Prompt tokens its endpoint was predicted to hold in its prefix cache when it was placed there: its
    # prefill computed only the rest (`prefill_tokens`).
    cached_tokens: int = 0
    # Its fields but those of its progress reports (`KEPT_FIELDS`) as one tuple (`kept_of`), made at its
    # first progress report (or when first compared) and handed on to every later copy (`with_progress`):
    # two records of one running request then compare by the tuple's identity, not field by field
    # (`gateway.sched.load_terms.same_requests`). No part of its value (no init, compare, hash or repr);
    # `dataclasses.replace` starts it afresh.
    kept: tuple[object, ...] | None = field(default=None, init=False, compare=False, hash=False, repr=False)

    @property
    def prefill_tokens(self) -> int:
        """The prompt tokens its prefill computes (the uncached ones)."""
        return uncached(self.prompt_tokens, self.cached_tokens)


#: What a running request keeps while it runs on one endpoint: every field but those of its progress
#: reports (`with_progress` copies it with new `produced`, `first_token_at` and `reported_at`).
KEPT_FIELDS: Final = (
    "id",
    "dispatched_at",
    "resumable",
    "slo_class",
    "prompt_tokens",
    "output_mean",
    "output_std",
    "max_tokens",
    "ttft_deadline",
    "e2e_deadline",
    "itl_s",
    "best_effort",
    "preemptions",
    "produced_before",
    "cached_tokens",
)
_KEPT: Final = attrgetter(*KEPT_FIELDS)


def kept_of(r: RunningRequest) -> tuple[object, ...]:
    """`r`'s `KEPT_FIELDS` as a tuple: its `kept` memo, made now when it has none."""
    got = r.kept
    if got is None:
        got = r.kept = _KEPT(r)  # type: ignore[misc]  # (a memo: frozen to the type checker)
    return got


def remaining_max_tokens(req: SchedRequest) -> int | None:
    """The request's max_tokens less what its earlier (preempted) runs produced: what a resumed run
    may still produce (at least 1); None without max_tokens."""
    if req.max_tokens is None:
        return None
    return max(1, req.max_tokens - req.produced_tokens)


def resume_prompt_tokens(req: SchedRequest) -> int:
    """The tokens an engine prefills for the request's next run: its prompt, plus what its earlier runs
    produced (a resumed request re-sends them, and the engine recomputes their KV cache)."""
    return req.prompt_tokens + req.produced_tokens


def prefill_tokens(req: SchedRequest, endpoint: EndpointId) -> int:
    """The tokens an engine at `endpoint` prefills for the request's next run: `resume_prompt_tokens`
    less the prefix the endpoint is predicted to hold (`SchedRequest.cached`)."""
    return uncached(req.prompt_tokens + req.produced_tokens, req.cached.get_tokens(endpoint))


def output_estimate(req: SchedRequest) -> tuple[float, float]:
    """(mean, standard deviation) of the request's output tokens still to come: the predictor's figures
    when it ran (the spread from its p90 under a normal), else max_tokens (or a default) with no spread;
    less what earlier, preempted runs produced (at least 1 token)."""
    done = req.produced_tokens
    mean = req.predicted_output_tokens
    if mean is not None:
        p90 = req.predicted_output_p90
        std = max(0.0, (p90 - mean) / Z90) if p90 is not None else 0.0
        return max(1.0, mean - done), std
    if req.max_tokens is not None:
        return float(max(1, req.max_tokens - done)), 0.0
    return max(1.0, DEFAULT_OUTPUT_TOKENS - done), 0.0


def deadlines(req: SchedRequest) -> tuple[float | None, float | None]:
    """(first-token deadline, last-token deadline) in clock seconds, from the SLO's targets. A resumed
    request (its earlier run streamed tokens) has had its first token: it has no first-token deadline."""
    slo = req.slo
    ttft = None if slo.ttft_ms is None or req.produced_tokens > 0 else req.arrival + slo.ttft_ms / 1000.0
    e2e = None if slo.deadline_ms is None else req.arrival + slo.deadline_ms / 1000.0
    return ttft, e2e


def running_from(req: SchedRequest, now: float, endpoint: EndpointId | None = None) -> RunningRequest:
    """The running record of `req` placed on `endpoint` at `now` (its cached prefix there is known
    when the endpoint is given)."""
    mean, std = output_estimate(req)
    ttft, e2e = deadlines(req)
    itl_ms = req.slo.itl_ms
    # Positional, in field order: one is made per dispatch, and a call with keywords spends time
    # matching them to the parameters.
    return RunningRequest(
        req.id,
        req.slo.slo_class,
        resume_prompt_tokens(req),  # prompt_tokens
        mean,  # output_mean
        std,  # output_std
        remaining_max_tokens(req),  # max_tokens
        now,  # dispatched_at
        ttft,  # ttft_deadline
        e2e,  # e2e_deadline
        None if itl_ms is None else itl_ms / 1000.0,  # itl_s
        req.best_effort,
        req.resumable,
        req.preemptions,
        req.produced_tokens,  # produced_before
        None,  # produced
        None,  # first_token_at
        None,  # reported_at
        0 if endpoint is None else req.cached.get_tokens(endpoint),  # cached_tokens
    )


def with_progress(
    r: RunningRequest, produced: int, first_token_at: float | None, reported_at: float
) -> RunningRequest:
    """`r` with a progress report: what `dataclasses.replace` makes, built directly (a stream reports
    every 16 tokens, and `replace` looks the fields up on every call: about 3 µs of 5). The copy takes
    over `r`'s `kept` (its fields but the progress are `r`'s), made now at its first report (`kept_of`,
    spelled out: one call less per report)."""
    kept = r.kept
    if kept is None:
        kept = r.kept = _KEPT(r)  # type: ignore[misc]  # (a memo: frozen to the type checker)
    out = RunningRequest(
        r.id,
        r.slo_class,
        r.prompt_tokens,
        r.output_mean,
        r.output_std,
        r.max_tokens,
        r.dispatched_at,
        r.ttft_deadline,
        r.e2e_deadline,
        r.itl_s,
        r.best_effort,
        r.resumable,
        r.preemptions,
        r.produced_before,
        produced,
        first_token_at,
        reported_at,
        r.cached_tokens,
    )
    out.kept = kept  # type: ignore[misc]  # (frozen to the type checker; set once, as it is made)
    return out
