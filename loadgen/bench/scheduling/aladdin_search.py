"""Aladdin's benchmark arithmetic: the ATGT capacity floor no router can beat, the fewest-endpoints
search (gallop from a guess, then bisect) and the worker-count model ``N = ceil(k5·rate + c5)``. The
floor's derivation (what `call_cost_s` calls "the module doc") is in `loadgen.bench.scheduling.aladdin`'s
docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from loadgen.bench.scheduling.aladdin_probe import ATGT_S, GOODPUT_TARGET, TTFT_S
from loadgen.engine_sim.profiles import EngineProfile
from loadgen.workloads.base import TaskSpec


# --------------------------------------------------------------------- the floor
def call_cost_s(profile: EngineProfile, prompt: int, output: int, *, ttft_s: float) -> float:
    """Seconds of per-request engine work a call costs at the least (see the module doc): its decode
    tokens' ``c2 + k2·context``, its prefill, and its share of the prefill iteration's fixed cost."""
    lat = profile.latency
    p = max(1, prompt)
    by_ttft = int((ttft_s - lat.c1) / (lat.k1 * p)) if lat.k1 > 0 else profile.max_num_seqs
    share = max(1, min(profile.max_num_seqs, profile.max_prefill_tokens // p, by_ttft))
    n = max(0, output - 1)
    decode = n * (lat.k2 * p + lat.c2) + lat.k2 * n * (n + 1) / 2
    return lat.k1 * p + lat.c1 / share + decode


@dataclass(frozen=True, slots=True)
class SloFloor:
    rate: float
    per_endpoint: float  # cost-seconds one endpoint can spend per second: 1 − c3 / ATGT
    cost_all: float  # mean cost per call, every call served
    cost_kept: float  # the same with the costliest (1 − goodput) share given up (summed over kept / all)

    @property
    def endpoints_all(self) -> float:
        return self.rate * self.cost_all / self.per_endpoint

    @property
    def endpoints_kept(self) -> float:
        return self.rate * self.cost_kept / self.per_endpoint


def slo_floor(
    profile: EngineProfile,
    tasks: Sequence[TaskSpec],
    rate: float,
    *,
    ttft_s: float = TTFT_S,
    atgt_s: float = ATGT_S,
    goodput: float = GOODPUT_TARGET,
) -> SloFloor:
    """The fewest endpoints (fractional) that can serve `tasks` at `rate` calls/s within the ATGT target."""
    c3 = profile.latency.c3
    if atgt_s <= c3:
        raise ValueError(f"an ATGT target of {atgt_s * 1000:g} ms is below one decode iteration's fixed cost")
    if not tasks:
        raise ValueError("no tasks to size")
    costs = sorted(
        call_cost_s(profile, c.prompt_tokens, c.output_tokens, ttft_s=ttft_s) for t in tasks for c in t.calls
    )
    keep = math.ceil(len(costs) * goodput - 1e-9)
    calls_per_task = len(costs) / len(tasks)
    return SloFloor(
        rate=rate * calls_per_task,
        per_endpoint=1.0 - c3 / atgt_s,
        cost_all=sum(costs) / len(costs),
        cost_kept=sum(costs[:keep]) / len(costs),
    )


# --------------------------------------------------------------------- the search
@dataclass(slots=True)
class Search:
    fewest: int | None  # None: not even `hi` endpoints were enough
    probes: dict[int, bool] = field(default_factory=dict)  # endpoints -> passed, in probe order


def fewest(ok: Callable[[int], bool], *, lo: int, hi: int, guess: int) -> Search:
    """The smallest n in [lo, hi] with ok(n), for ok monotone in n (false up to some n, true from it):
    gallop from `guess` (down while it passes, up while it fails, doubling the step), then bisect. About
    2·log2(|answer − guess|) + 2 probes; each n is probed at most once; n − 1 is probed whenever the
    answer n > lo."""
    if lo > hi:
        raise ValueError("empty search range")
    out = Search(None)

    def test(n: int) -> bool:
        if n not in out.probes:
            out.probes[n] = ok(n)
        return out.probes[n]

    g = min(hi, max(lo, guess))
    bad = lo - 1  # the largest n known to fail (lo - 1: none below lo)
    if test(g):
        good, step = g, 1
        while good - step >= lo:
            n = good - step
            if not test(n):
                bad = n
                break
            good, step = n, step * 2
    else:
        bad, step = g, 1
        while True:
            if bad >= hi:
                return out
            n = min(hi, bad + step)
            if test(n):
                good = n
                break
            bad, step = n, step * 2
    while good - bad > 1:
        mid = (good + bad) // 2
        if test(mid):
            good = mid
        else:
            bad = mid
    out.fewest = good
    return out


# --------------------------------------------------------------------- the worker-count model
@dataclass(frozen=True, slots=True)
class WorkerModel:
    """Aladdin's ``N = ceil(k5·rate + c5)``, least squares over (rate, fewest endpoints) points."""

    k5: float
    c5: float
    points: int
    max_residual: float  # the largest |N − (k5·rate + c5)| over the points

    def workers(self, rate: float) -> int:
        return max(1, math.ceil(self.k5 * rate + self.c5 - 1e-9))


def fit_workers(points: Sequence[tuple[float, int]]) -> WorkerModel | None:
    """The least-squares line through (rate, N); None with fewer than two distinct rates."""
    if len({r for r, _ in points}) < 2:
        return None
    x = np.array([r for r, _ in points], dtype=np.float64)
    y = np.array([n for _, n in points], dtype=np.float64)
    k5, c5 = np.polyfit(x, y, 1)
    resid = float(np.max(np.abs(y - (k5 * x + c5))))
    return WorkerModel(float(k5), float(c5), len(points), resid)
