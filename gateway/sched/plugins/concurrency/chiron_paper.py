"""Chiron's local autoscaler exactly as the paper states it (papers/ALGORITHMS.md §5), for comparison
with berth's `chiron` (which departs from it where the plain rule failed in the simulator; its module
docstring lists how and why).

At most every `interval_s` (clock), when the endpoint's running set changes, the controller reads what
the endpoint streamed since its last reading (the dispatcher's progress reports) and computes
LBP = observed per-token time / the tightest inter-token target among the requests it runs (0 when none
has one), TBP = the previous reading's throughput / this reading's (output tokens per second; 0 on the
first reading), bp = max(LBP, TBP); below 1 the cap grows ``B ← α·B/bp + (1 − α)·B`` (with bp = 0 by
`max_growth`, which also bounds every growth: the paper leaves B/0 undefined), at or above 1 it halves.
Nothing else: it grows with seats standing empty, judges every reading, and halves on a throughput dip.

B is kept as a real number and enforced rounded down; the scheduler clamps it into [`min_cap`, the
endpoint's hard maximum]. A reading with no tokens streamed leaves B as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import msgspec
from msgspec import Meta

from gateway.core.types import EndpointId
from gateway.sched.plugins.concurrency.reading import take_reading
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.snapshot import EndpointView


class ChironPaperParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    alpha: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.5
    min_cap: Annotated[int, Meta(ge=1, le=100_000)] = 1
    interval_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 2.0
    start: Annotated[int, Meta(ge=1, le=100_000)] | None = None  # initial cap (default: the maximum)
    max_growth: Annotated[float, Meta(gt=1.0, le=100.0)] = 2.0


@dataclass(slots=True)
class _State:
    b: float
    at: float
    tokens: int
    gap_s: float
    gap_tokens: int
    rate: float | None = None  # output tokens/s of the previous reading


class ChironPaperController:
    name = "chiron-paper"

    def __init__(self, params: ChironPaperParams) -> None:
        self.params = params
        self.floor = params.min_cap
        self._state: dict[EndpointId, _State] = {}

    def cap(self, view: EndpointView, now: float) -> int:
        p = self.params
        hard = view.hard_cap
        st = self._state.get(view.id)
        if st is None:
            b = float(min(hard, p.start if p.start is not None else hard))
            st = self._state[view.id] = _State(b, now, view.streamed_tokens, view.gap_s, view.gap_tokens)
            return self._enforced(st, hard)
        if now - st.at < p.interval_s:
            return self._enforced(st, hard)
        r = take_reading(st, view, now)
        if r is None:
            return self._enforced(st, hard)
        itl = r.itl_s
        lbp = itl / r.itl_target_s if itl is not None and r.itl_target_s is not None else 0.0
        rate = r.rate
        tbp = st.rate / rate if st.rate is not None else 0.0
        st.rate = rate
        bp = max(lbp, tbp)
        if bp >= 1.0:
            st.b /= 2.0
        else:
            grown = p.alpha * st.b / bp + (1.0 - p.alpha) * st.b if bp > 0 else st.b * p.max_growth
            st.b = min(grown, st.b * p.max_growth)
        st.b = min(max(st.b, float(self.floor)), float(hard))
        return self._enforced(st, hard)

    def _enforced(self, st: _State, hard: int) -> int:
        return max(self.floor, min(hard, int(st.b)))


SPEC = PluginSpec(
    PluginKind.CONCURRENCY,
    "chiron-paper",
    ChironPaperParams,
    lambda p, ctx: ChironPaperController(p),
    "Chiron's rule as the paper states it (grow on bp < 1, halve on bp >= 1), for comparison",
)
