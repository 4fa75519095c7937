"""Chiron's local autoscaler (papers/ALGORITHMS.md §5): each endpoint's cap follows its backpressure.

At most every `interval_s` (clock), when the endpoint's running set changes, the controller reads what
the endpoint streamed since its last reading (the dispatcher's progress reports, `EndpointView`'s token
counters) and computes

- LBP = observed per-token time / (`headroom` × the tightest inter-token target among the requests it
  runs) (0 when none has one): with headroom 1 (Chiron's rule, the default) the cap settles where the
  endpoint's average token time reaches the target; 0.8 aims 20 % under it, for engines whose token
  times spread more between streams (on the classes benchmark 0.8 cost batch throughput and gained no
  attainment); the observed time is the streams' time between progress reports over the tokens
  between them, else telemetry's `itl_ewma_s`;
- TBP = throughput before the last growth / (throughput now × (1 + `tolerance`)) (output tokens per
  second; a dip within the tolerance is the noise of a few seconds' sample), judged once per growth,
  while the cap binds, and not on the reading right after the growth: the requests let in by the
  growth are prefilled together and pause every decode for a while, a transient that says nothing
  about the larger batch (judging on it undid every doubling); an endpoint with free seats streams
  less because it is given less, and one whose cap was just cut streams less because of the cut;
- bp = max(LBP, TBP): below 1 the cap grows ``B ← α·B/bp + (1 − α)·B`` (at most `max_growth` times per
  step; with bp = 0 by that much); with LBP at or above 1 it halves (Chiron; `cut = "margin"`: to
  B / LBP, at least halving); with TBP alone at or above
  1 it goes back to the cap before its last growth (Chiron halves here too; but a throughput sample of a
  few seconds is noisy, and halving a batch endpoint's cap on noise costs far more throughput than the
  growth it undoes).

A reading counts only the gaps that began after the endpoint's last cut (`EndpointView.gap_after_cut_s`):
a stream reports its progress every few tokens, so for a while after a cut its reports still hold time
it spent in the larger batch, and a reading that counted them (the paper's) cut a second time on the
latency the first cut had already dealt with (on the classes benchmark mixed endpoints went
128 -> 64 -> 32 within about 3 s, each cut preempting batch work). Until such a gap is reported the cap
holds.

A spill is not latency pressure: when a request with a tighter ITL target than any the endpoint ran
(an interactive stream spilled onto a mixed endpoint full of batch work) joins its running set, the
reading that follows measured the old running set against its looser targets; its placement (the
overflow guard, and the preemptions made for it) judged that it fits. That reading is not held against
the new target: the cap holds, and the next reading, under the tighter target, judges (and cuts when
the latency there is over it). Latency over a target that did not change is pressure: the cap halves.
Measured together (classes benchmark, caps starting at the bound, seeds 0-1): at 3 interactive req/s
seed 1 kept 2385 batch tok/s against 2345 without them (577 preemptions against 463, attainment 1.000
both; seed 0 preempts nothing either way); at 6 req/s attainment 0.997 both, 1906/1910 tok/s against
1909/1873. Cutting to the margin instead of halving (`cut = "margin"`, or only on endpoints running
looser targets too) lifted rate 3 to 2430 tok/s but let rate 6's attainment fall to 0.87-0.95: the
decode time has a fixed part, so B / LBP cuts too little and the streams wait readings for the rest.

The cap grows only while it binds (as many requests run as it allows): a cap that grew while seats
stood empty would let the next burst in all at once, past the latency it was never measured at.
While an earlier cut is still draining (more requests run than the cap allows: a lower cap takes no
seat), a backpressure at or above 1 holds the cap rather than halving it again: the running set has not
shrunk to the cap yet, so the reading says nothing about it.

These (the tolerance, judging a growth once, undoing instead of halving on throughput, growing only
while binding, holding while a cut drains, gaps after the cut only, a spill judged under its target) are
berth's departures from the paper's rule (`chiron-paper` is the rule as stated; the classes
benchmark runs both, `d-berth` and `d-chiron-paper`: the paper's rule keeps 0.146 of interactive
requests within their SLO at 3 req/s, its halvings on throughput noise bringing caps down to `min_cap`).

B is kept as a real number and enforced rounded down; the scheduler clamps it into [`min_cap`, the
endpoint's bound] (the operator's configured cap, else the engine's batch size its gauges showed:
`gateway.sched.fleet`). A reading with no tokens streamed leaves B as it is. B starts at `start`
(default: the bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gateway.core.types import EndpointId
from gateway.sched.plugins.concurrency.reading import take_reading
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.snapshot import EndpointView


class ChironParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    alpha: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.5  # weight of the proportional growth
    min_cap: Annotated[int, Meta(ge=1, le=100_000)] = 1  # the policy's minimum cap
    interval_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 2.0  # between two changes of a cap
    start: Annotated[int, Meta(ge=1, le=100_000)] | None = None  # initial cap (default: configured)
    max_growth: Annotated[float, Meta(gt=1.0, le=100.0)] = 2.0  # cap growth per step at most
    throughput: bool = True  # use TBP (False: the latency backpressure alone)
    headroom: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0  # aim at this share of the ITL target
    # A throughput drop within this share is noise, not backpressure (TBP = previous / (current·(1 + it))).
    tolerance: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.1
    # How a latency backpressure at or above 1 cuts the cap: "halve" (Chiron) or "margin", to B / LBP
    # (the cap the observed per-token time says keeps the target, never below B / 2). Not the default:
    # on the classes benchmark "margin" (with settling after cuts) lifted batch throughput at 3
    # interactive req/s (0.899x least outstanding's, from 0.885x) but let interactive attainment at 6
    # req/s fall to 0.89 (from 0.999).
    cut: Literal["halve", "margin"] = "halve"


@dataclass(slots=True)
class _State:
    b: float  # the cap, unrounded
    at: float  # clock time of the last reading
    tokens: int  # the view's counters then
    gap_s: float
    gap_tokens: int
    base: float = 0.0  # the cap before its last growth
    ref: float | None = None  # output tokens/s at that cap (the reading that grew it)
    pending: bool = False  # a growth whose throughput is still to be judged (TBP)
    settling: bool = False  # the reading right after a growth is skipped (see the module docstring)
    target: float | None = None  # the tightest ITL target among the running requests at the last call
    tightened_at: float = -math.inf  # when that target last became tighter (a spill; module docstring)


class ChironController:
    name = "chiron"

    def __init__(self, params: ChironParams) -> None:
        self.params = params
        self.floor = params.min_cap
        self._state: dict[EndpointId, _State] = {}

    def cap(self, view: EndpointView, now: float) -> int:
        p = self.params
        hard = view.hard_cap
        st = self._state.get(view.id)
        if st is None:
            b = float(min(hard, p.start if p.start is not None else hard))
            st = self._state[view.id] = _State(
                b, now, view.streamed_tokens, view.gap_after_cut_s, view.gap_after_cut_tokens
            )
            st.target = _tightest(view)
            return self._enforced(st, hard)
        target = _tightest(view)
        if target is not None and st.target is not None and target < st.target:
            st.tightened_at = now
        st.target = target
        if now - st.at < p.interval_s:
            return self._enforced(st, hard)
        since = st.at
        r = take_reading(st, view, now, after_cut=True)
        if r is None or st.tightened_at > since or (r.itl_s is None and view.cut_at >= since):
            # Nothing streamed; or a spill: the latency was measured before a request with a tighter
            # target ran here (its placement judged that it fits), so it is no pressure against that
            # target; or a cut with no gap measured under it yet. The next reading judges.
            return self._enforced(st, hard)
        itl = r.itl_s
        lbp = itl / (p.headroom * r.itl_target_s) if itl is not None and r.itl_target_s is not None else 0.0
        rate = r.rate
        draining = view.inflight > int(st.b)
        # Binding: every seat taken, or all but the one a completion just freed (the controller runs on
        # the completion, before the queue refills the seat).
        bound = int(st.b) - 1 <= view.inflight <= int(st.b)
        before = st.b
        if lbp >= 1.0:
            if not draining:
                st.b /= 2.0 if p.cut == "halve" else min(2.0, lbp)
            st.pending = st.settling = False
        elif st.settling:
            st.settling = False  # the new seats' prefills paused decoding: judge the growth next time
        elif bound or st.pending:
            tbp = 0.0
            if st.pending and p.throughput and bound and st.ref is not None:
                tbp = st.ref / (rate * (1.0 + p.tolerance))
            st.pending = False
            if tbp >= 1.0:
                st.b = st.base  # the last growth did not pay: back to the cap before it
            elif bound:
                bp = max(lbp, tbp)
                grown = p.alpha * st.b / bp + (1.0 - p.alpha) * st.b if bp > 0 else st.b * p.max_growth
                st.b = min(grown, st.b * p.max_growth)
        st.b = min(max(st.b, float(self.floor)), float(hard))
        if st.b > before:
            st.base, st.ref = before, rate
            st.pending = st.settling = True
        return self._enforced(st, hard)

    def _enforced(self, st: _State, hard: int) -> int:
        return max(self.floor, min(hard, int(st.b)))


def _tightest(view: EndpointView) -> float | None:
    return min((r.itl_s for r in view.running if r.itl_s is not None), default=None)


SPEC = PluginSpec(
    PluginKind.CONCURRENCY,
    "chiron",
    ChironParams,
    lambda p, ctx: ChironController(p),
    "Chiron: each endpoint's cap from its ITL and throughput backpressure",
)
