"""How long a request will wait for its turn: Chiron's queue estimate and CATO's replica wait.

**Chiron (§5).** The requests ahead of a queued request must produce their output tokens first; at an
endpoint (or group of endpoints) serving ``tokens_per_s`` output tokens per second the wait is
``W = Σ tokens ahead / tokens_per_s``. With each length an independent random variable (mean μ_i,
variance σ_i², e.g. from `OutputLengthPredictor`), ``Σ`` has mean ``Σ μ_i`` and variance ``Σ σ_i²``, and by
the central limit theorem is close to normal once a few dozen requests are ahead; the bound for a
quantile q is ``mean + z(q) · std``. For a distribution-free bound (Aladdin's tail mode) use
``tail="cantelli"``: ``mean + sqrt(q / (1 − q)) · std`` holds for any distribution (Cantelli's inequality
with violation probability ``τ = 1 − q``; `cantelli_factor`).

Which requests are "ahead" is the caller's choice. On an endpoint that runs ``B`` requests at once, FCFS,
a request at queue position ``k`` (0-based, counting those running) starts when ``k − B + 1`` of the
requests before it have finished. The ``B − 1`` still running then have, each, a length-biased residual
of ``ō · (1 + cv²) / 2`` tokens left (``cv`` the coefficient of variation of output lengths, about 1 for
ShareGPT-like traffic), so the tokens produced before it starts are about those of the first
``k − B + 1`` requests; passing all ``k`` overestimates every wait by that residual work.
``tokens_per_s`` should be the sustained output rate with the prefill pauses included, e.g.
``ō / (t_pre(p̄) + ō · t_dec(B, l̄) / B)`` from the performance model.

**CATO (§1).** A replica's wait is the sum of the expected completion times of the requests queued there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.sched.waiting import Tail, WaitEstimate, cantelli_factor, wait_normal
from gateway.telemetry.lengths import LengthPrediction

__all__ = ["Tail", "WaitEstimate", "cantelli_factor", "wait_cato", "wait_for_position", "wait_normal"]


def wait_for_position(
    preds_ahead: Sequence[LengthPrediction],
    tokens_per_s: float,
    *,
    quantile: float = 0.9,
    tail: Tail = "normal",
) -> WaitEstimate:
    """`wait_normal` over the requests ahead: their means and variances add (independent lengths)."""
    mean = math.fsum(p.mean for p in preds_ahead)
    var = math.fsum(p.std * p.std for p in preds_ahead)
    return wait_normal(mean, var, tokens_per_s, quantile=quantile, tail=tail)


def wait_cato(expected_completion_s: Sequence[float]) -> float:
    """CATO's replica wait: the sum of the expected completion times of the requests queued there."""
    return math.fsum(max(0.0, t) for t in expected_completion_s)
