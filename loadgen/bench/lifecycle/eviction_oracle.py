"""The eviction benchmark's clairvoyant bound: Belady's rule on the run's own trace.

`BeladyEvictor` evicts the resident model whose next request arrives farthest in the future (no later
request: first of all), reading the arrival times from the workload's schedule, which the simulator
replays exactly. No online evictor can know this; with one size of object it minimises misses, and
here (two model sizes, one load per device, busy instances not evictable) it is the reference an
evictor's figures are judged against: what any evictor could gain over LRU in the setting.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from gateway.core.types import ModelName
from gateway.sched.plugins.eviction.interface import EvictionCandidate, EvictionContext
from loadgen.fleetsim.options import SimOptions, schedule_of

#: Score of a model that is never requested again (beyond any real gap, and finite: the runner's contract).
NEVER_AGAIN_S = 1e12


class BeladyEvictor:
    name = "belady"

    def __init__(self, arrivals: Mapping[ModelName, Sequence[float]]) -> None:
        self._arrivals = {m: sorted(ts) for m, ts in arrivals.items()}

    def score(self, cand: EvictionCandidate, ctx: EvictionContext) -> float:
        ts = self._arrivals.get(cand.model, ())
        k = bisect.bisect_right(ts, ctx.now)
        return NEVER_AGAIN_S if k >= len(ts) else ts[k] - ctx.now


def trace_arrivals(opts: SimOptions) -> dict[ModelName, list[float]]:
    """When each model is asked for in the simulation `opts` runs (its schedule, same seed). A call's time
    is its task's arrival plus the client gaps before it (exact for one-call tasks, as `multi-model`'s)."""
    if not opts.models:
        raise ValueError("the oracle needs the run's model list (SimOptions.models)")
    out: dict[ModelName, list[float]] = {}
    for task in schedule_of(opts):
        at = task.at_s
        for call in task.calls:
            at += call.gap_before_s
            model = call.model or opts.models[call.model_slot % len(opts.models)]
            out.setdefault(ModelName(model), []).append(at)
    return out
