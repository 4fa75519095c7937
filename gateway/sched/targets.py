"""Whether a prediction (`gateway.sched.predict`) keeps a request's SLO targets: the time it has left
until each deadline, and the verdicts placement, ordering and admission plugins share.
"""

from __future__ import annotations

from gateway.sched.predict import Prediction
from gateway.sched.request import SchedRequest
from gateway.sched.running import deadlines


def time_left(req: SchedRequest, now: float) -> tuple[float | None, float | None]:
    """Seconds until the request's first-token and last-token deadlines (None: no such target)."""
    ttft, e2e = deadlines(req)
    return (None if ttft is None else ttft - now), (None if e2e is None else e2e - now)


def meets(pred: Prediction, left: tuple[float | None, float | None], margin: float = 1.0) -> bool:
    """Whether a prediction keeps both deadlines (`margin` < 1 demands room to spare)."""
    ttft_left, e2e_left = left
    if ttft_left is not None and pred.ttft_s > ttft_left * margin:
        return False
    return not (e2e_left is not None and pred.e2e_s > e2e_left * margin)


def itl_ok(req: SchedRequest, pred: Prediction) -> bool:
    itl = req.slo.itl_ms
    return itl is None or pred.tpot_s * 1000.0 <= itl
