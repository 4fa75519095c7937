"""The x-berth-* response headers every API response carries: where it ran, how long it queued, its SLO
class, and (when the whole answer is known before it is sent: non-streamed and error responses)
whether it met its SLO."""

from __future__ import annotations

from gateway.dispatch.context import RequestContext
from gateway.telemetry.attainment import meets_slo


def slo_met_now(ctx: RequestContext, now: float) -> bool:
    """Whether a non-streamed answer complete at `now` met its SLO (its first token is its last)."""
    if ctx.sched is None:
        return True
    e2e = now - ctx.arrival
    return meets_slo(ctx.sched.slo, ok=True, ttft_s=e2e, itl_s=None, e2e_s=e2e)


def berth_headers(ctx: RequestContext) -> dict[str, str]:
    """Where the request ran, how long it queued and its SLO class."""
    queue_s = ctx.queue_s
    return {
        "X-Berth-Endpoint": ctx.endpoint or "",
        "X-Berth-Queue-Ms": "0.0" if queue_s is None else f"{queue_s * 1000.0:.1f}",
        "X-Berth-Slo-Class": ctx.slo_class,
    }


def answer_headers(ctx: RequestContext, content_type: str) -> dict[str, str]:
    """The headers of an engine's answer relayed to its client (a stream's, or a whole body's before
    its SLO verdict is added)."""
    headers = berth_headers(ctx)
    headers["Content-Type"] = content_type
    headers["X-Request-Id"] = ctx.id
    return headers


def error_headers(ctx: RequestContext) -> dict[str, str]:
    """The berth headers of an error response (which never meets an SLO)."""
    headers = berth_headers(ctx)
    headers["X-Berth-Slo-Met"] = "false"
    return headers
