"""SLO admission's question when a seat is free for a request: does it meet its SLO dispatched now on
one of the endpoints with a free seat? (`gateway.sched.plugins.admission.slo_feasibility`.) The
endpoints are asked in order and the first that meets it ends the walk, so the loads asked for are
those up to it: each is part of what later decisions see (the load cache keeps it), whatever the
answer.

Each endpoint's numbers are `EndpointLoad.predict`'s, the same operations in the same order, compared
with the limits as `SloFeasibilityAdmitter._meets` compares a prediction's (pinned by
`tests/unit/test_admission_free_seat.py`), without a `Prediction` made per endpoint: in the 200-endpoint
what-if most submits are admitted at the first endpoint, and a few hundred walk 10 to 150 endpoints
that all miss."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from gateway.sched.predict import EndpointLoad
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens

#: The limits a prediction is held to: first token, last token (seconds from now) and per-token time
#: (ms), each its target times the admitter's margin; None: no such target.
Limits = tuple[float | None, float | None, float | None]


class Missed(NamedTuple):
    """The loads a walk tried, every one missed, in order, and `req`'s predicted first and last token on
    each, as `EndpointLoad.predict` has them (`ttft_s`, `e2e_s`): what a refusal reports."""

    loads: list[EndpointLoad]
    ttfts: list[float]
    e2es: list[float]


def misses_everywhere(
    loads: Iterable[EndpointLoad], req: SchedRequest, limits: Limits, *, worst_case: bool
) -> Missed | None:
    """None when `req` dispatched now on one of `loads` (taken in order, up to the first where it does)
    meets `limits`; else the loads, every one of them tried, and its times there (the refusal's).

    Each load's times are `EndpointLoad.predict`'s first token, last token and per-token time, spelled
    out inline (the same operations in the same order): a walk of a refused request takes up to every
    endpoint of the model."""
    ttft_lim, e2e_lim, itl_lim = limits
    tried: list[EndpointLoad] = []
    ttfts: list[float] = []
    e2es: list[float] = []
    p = float(req.prompt_tokens + req.produced_tokens)
    # the tokens its prefill computes, the same everywhere when no endpoint holds a prefix of it
    fresh = None if req.cached else req.prompt_tokens + req.produced_tokens
    # the output planned for: the same for every load of one cache (its gamma), taken from the first
    out = 0.0
    steps = 0.0  # out - 1.0, at least 0
    first = True
    for load in loads:
        if first:
            first = False
            out = load.output_tokens(req)
            steps = out - 1.0
            if not steps > 0.0:
                steps = 0.0
        c = load.coef
        pre = prefill_tokens(req, load.view.id) if fresh is None else fresh
        ttft = load.wait_s + (c.k1 * (pre + load.pending_prompt) + c.c1)
        n, seats = load.n, load.seats
        b = float(seats) if worst_case else float(n + 1 if n + 1 < seats else seats)
        avg_ctx = (load.ctx_sum + p + 0.5 * out) / (n + 1)
        tpot = ((c.k2 * avg_ctx + c.c2) * b + c.c3) * (1.0 + load.overhead)
        e2e = ttft + steps * tpot
        if (
            (ttft_lim is None or ttft <= ttft_lim)
            and (e2e_lim is None or e2e <= e2e_lim)
            and (itl_lim is None or tpot * 1000.0 <= itl_lim)
        ):
            return None
        tried.append(load)
        ttfts.append(ttft)
        e2es.append(e2e)
    return Missed(tried, ttfts, e2es)
