"""The scheduling benchmarks' statistics over seeds: a mean with the half-width of its 95 % confidence
interval (Student t), and each policy's means (`policy_means`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from loadgen.bench.scheduling.scheduling_types import (
    TASK_TYPES,
    RunResult,
)

#: Two-sided 95 % quantiles of Student's t for 1 .. 30 degrees of freedom.
T95: Final = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
Z975: Final = 1.959964


def t95(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with `df` degrees of freedom: the table up to 30, then
    the Cornish-Fisher expansion around the normal quantile (within 1e-4 there)."""
    if df < 1:
        raise ValueError("Student's t needs at least one degree of freedom")
    if df <= len(T95):
        return T95[df - 1]
    z = Z975
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


@dataclass(frozen=True, slots=True)
class MeanCI:
    """A mean over runs and the half-width of its 95 % confidence interval (Student t over the runs;
    None with a single run)."""

    mean: float
    half: float | None
    n: int

    def text(self, digits: int = 3) -> str:
        m = f"{self.mean:.{digits}f}"
        return m if self.half is None else f"{m} ±{self.half:.{digits}f}"


def mean_ci(values: Sequence[float]) -> MeanCI:
    """The mean of `values` and its 95 % confidence interval's half-width: t(n - 1) × s / √n."""
    n = len(values)
    if not n:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n < 2:
        return MeanCI(mean, None, n)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return MeanCI(mean, t95(n - 1) * math.sqrt(var / n), n)


@dataclass(frozen=True, slots=True)
class PolicyMean:
    """A policy's runs at one rate, averaged over their seeds."""

    policy: str
    goodput: float
    low: float  # the smallest and largest goodput of a single run
    high: float
    tasks: dict[str, float]  # task type -> mean goodput (over the runs that report it)
    runs: int
    goodput_ci: MeanCI
    task_ci: dict[str, MeanCI]
    by_seed: dict[int, float]  # seed -> goodput (one run per seed)
    utilization: float | None
    rejected: float  # berth's rejections per run
    wall_s: float  # per run


def policy_means(runs: Sequence[RunResult]) -> list[PolicyMean]:
    """Per policy (first-seen order), the mean of its runs' goodputs; runs without a goodput are left out."""
    out: list[PolicyMean] = []
    for policy in dict.fromkeys(r.policy for r in runs):
        mine = [r for r in runs if r.policy == policy and r.overall_goodput is not None]
        if not mine:
            continue
        goodputs = [r.overall_goodput or 0.0 for r in mine]
        task_ci: dict[str, MeanCI] = {}
        for t in TASK_TYPES:
            vals = [g for r in mine if (g := r.tasks.get(t, {}).get("goodput")) is not None]
            if vals:
                task_ci[t] = mean_ci(vals)
        ci = mean_ci(goodputs)
        utils = [r.utilization for r in mine if r.utilization is not None]
        out.append(
            PolicyMean(
                policy=policy,
                goodput=ci.mean,
                low=min(goodputs),
                high=max(goodputs),
                tasks={t: c.mean for t, c in task_ci.items()},
                runs=len(mine),
                goodput_ci=ci,
                task_ci=task_ci,
                by_seed={r.seed: r.overall_goodput or 0.0 for r in mine},
                utilization=sum(utils) / len(utils) if utils else None,
                rejected=sum(max(0, r.berth_rejections) for r in mine) / len(mine),
                wall_s=sum(r.wall_s for r in mine) / len(mine),
            )
        )
    return out
