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
    # Mean inter-token gap since then (the endpoint's EWMA when no gap was seen; with `after_cut`, None
    # when the cap was cut in between and no gap begun after the cut was reported yet).
    itl_s: float | None
    itl_target_s: float | None  # the tightest ITL SLO among the running requests; None: none has one


def take_reading(
    st: ReadingState, view: EndpointView, now: float, *, after_cut: bool = False
) -> Reading | None:
    """The reading since `st`'s, moving `st` to now; None when nothing was streamed in between.

    With `after_cut` the latency counts only the gaps that began after the endpoint's last cut
    (`EndpointView.gap_after_cut_s`): `st` must have been started from those counters too."""
    since = st.at
    gap_s_now, gap_tokens_now = (
        (view.gap_after_cut_s, view.gap_after_cut_tokens) if after_cut else (view.gap_s, view.gap_tokens)
    )
    tokens = view.streamed_tokens - st.tokens
    gap_tokens = gap_tokens_now - st.gap_tokens
    gap_s = gap_s_now - st.gap_s
    elapsed = now - since
    st.at, st.tokens, st.gap_s, st.gap_tokens = now, view.streamed_tokens, gap_s_now, gap_tokens_now
    if tokens <= 0 or elapsed <= 0:
        return None
    targets = [r.itl_s for r in view.running if r.itl_s is not None]
    if gap_tokens > 0:
        itl: float | None = gap_s / gap_tokens
    else:  # the EWMA holds gaps from before a cut: none to go by until one begun after it is reported
        itl = None if after_cut and view.cut_at >= since else view.itl_ewma_s
    return Reading(rate=tokens / elapsed, itl_s=itl, itl_target_s=min(targets) if targets else None)
