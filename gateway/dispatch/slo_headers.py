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


def error_headers(ctx: RequestContext) -> dict[str, str]:
    """The berth headers of an error response (which never meets an SLO)."""
    queue_ms = 0.0 if ctx.queue_s is None else ctx.queue_s * 1000.0
    return {
        "X-Berth-Endpoint": ctx.endpoint or "",
        "X-Berth-Queue-Ms": f"{queue_ms:.1f}",
        "X-Berth-Slo-Class": ctx.slo_class,
        "X-Berth-Slo-Met": "false",
    }
