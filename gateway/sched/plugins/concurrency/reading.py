"""One backpressure reading of an endpoint, shared by the Chiron controllers (`chiron`, `chiron-paper`):
what it streamed and how fast since the controller's previous reading, and the latency it showed
against the tightest ITL target among the requests it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.sched.snapshot import EndpointView


class ReadingState(Protocol):
    """The counters a controller keeps per endpoint between two readings."""

    at: float
    tokens: int
    gap_s: float
    gap_tokens: int


@dataclass(frozen=True, slots=True)
class Reading:
    rate: float  # output tokens/s since the previous reading
    itl_s: float | None  # mean inter-token gap since then (the endpoint's EWMA when no gap was seen)
    itl_target_s: float | None  # the tightest ITL SLO among the running requests; None: none has one


def take_reading(st: ReadingState, view: EndpointView, now: float) -> Reading | None:
    """The reading since `st`'s, moving `st` to now; None when nothing was streamed in between."""
    tokens = view.streamed_tokens - st.tokens
    gap_tokens = view.gap_tokens - st.gap_tokens
    gap_s = view.gap_s - st.gap_s
    elapsed = now - st.at
    st.at, st.tokens, st.gap_s, st.gap_tokens = now, view.streamed_tokens, view.gap_s, view.gap_tokens
    if tokens <= 0 or elapsed <= 0:
        return None
    targets = [r.itl_s for r in view.running if r.itl_s is not None]
    return Reading(
        rate=tokens / elapsed,
        itl_s=gap_s / gap_tokens if gap_tokens > 0 else view.itl_ewma_s,
        itl_target_s=min(targets) if targets else None,
    )
