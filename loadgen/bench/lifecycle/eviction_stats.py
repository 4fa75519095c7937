"""The eviction benchmark's figures and their confidence: one run's raw figures, the figures pooled over
seeds, and a paired bootstrap over seeds of one evictor's figures divided by another's.

Every evictor runs the same traces (one per seed), so the comparison is paired: a bootstrap resample
draws seeds with replacement and pools the same seeds for both evictors, then divides. The 95 %
interval of those ratios says whether a difference is the evictor's or the seeds' (a P99 over a few
hundred requests moves by tens of percent from one seed to the next).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from loadgen.report import Report

#: Bootstrap resamples of the seeds (the interval's ends move by well under 1 % between 1 000 and 10 000).
BOOTSTRAP: Final = 1000
#: Figures where lower is better (hit rate: higher is better).
LOWER_BETTER: Final = (
    "errors",
    "evictions",
    "load_seconds",
    "ttft_mean_ms",
    "ttft_completion_mean_ms",
    "ttft_completion_p99_ms",
    "ttft_reasoning_mean_ms",
    "ttft_reasoning_p99_ms",
    "e2e_mean_ms",
    "e2e_p99_ms",
)
HIGHER_BETTER: Final = ("hit_rate",)
JUDGED: Final = (*LOWER_BETTER, *HIGHER_BETTER)


@dataclass(frozen=True, slots=True)
class RunSample:
    """One run's raw figures (one seed, one evictor)."""

    requests: int
    errors: int
    evictions: int
    loads: int
    load_seconds: float
    hits: float  # requests whose model was ready when they arrived
    ttft_completion: npt.NDArray[np.float64]  # seconds, successful requests
    ttft_reasoning: npt.NDArray[np.float64]
    e2e: npt.NDArray[np.float64]


def run_sample(rep: Report) -> RunSample:
    ttft: dict[str, list[float]] = {"completion": [], "reasoning": []}
    e2e: list[float] = []
    errors = 0
    for r in rep.requests:
        if not r.ok:
            errors += 1
            continue
        if r.ttft_s is not None and r.cls in ttft:
            ttft[r.cls].append(r.ttft_s)
        if r.e2e_s is not None:
            e2e.append(r.e2e_s)
    lc = rep.data["lifecycle"]
    return RunSample(
        requests=len(rep.requests),
        errors=errors,
        evictions=lc["evictions"],
        loads=lc["loads"],
        load_seconds=lc["load_seconds"],
        hits=(lc["hit_rate"] or 0.0) * len(rep.requests),
        ttft_completion=np.array(ttft["completion"], dtype=np.float64),
        ttft_reasoning=np.array(ttft["reasoning"], dtype=np.float64),
        e2e=np.array(e2e, dtype=np.float64),
    )


def _mean_ms(xs: npt.NDArray[np.float64]) -> float | None:
    return float(xs.mean()) * 1000.0 if xs.size else None


def _p99_ms(xs: npt.NDArray[np.float64]) -> float | None:
    return float(np.percentile(xs, 99)) * 1000.0 if xs.size else None


def pooled(runs: Sequence[RunSample]) -> dict[str, float | None]:
    """The judged figures (and the counts beside them) over `runs` pooled: sums, and means and P99s over
    every request of every run. Not rounded (`figures` rounds for the report)."""
    n = sum(r.requests for r in runs)
    comp = np.concatenate([r.ttft_completion for r in runs])
    reas = np.concatenate([r.ttft_reasoning for r in runs])
    e2e = np.concatenate([r.e2e for r in runs])
    both = np.concatenate([comp, reas])
    return {
        "requests": float(n),
        "errors": float(sum(r.errors for r in runs)),
        "evictions": float(sum(r.evictions for r in runs)),
        "loads": float(sum(r.loads for r in runs)),
        "load_seconds": sum(r.load_seconds for r in runs),
        "hit_rate": sum(r.hits for r in runs) / n if n else None,
        "ttft_mean_ms": _mean_ms(both),
        "ttft_completion_mean_ms": _mean_ms(comp),
        "ttft_completion_p99_ms": _p99_ms(comp),
        "ttft_reasoning_mean_ms": _mean_ms(reas),
        "ttft_reasoning_p99_ms": _p99_ms(reas),
        "e2e_mean_ms": _mean_ms(e2e),
        "e2e_p99_ms": _p99_ms(e2e),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    """a ÷ b; 0 ÷ 0 is 1 (the same), x ÷ 0 is infinite; None when either is unknown."""
    if a is None or b is None:
        return None
    if b == 0:
        return 1.0 if a == 0 else float("inf")
    return a / b


@dataclass(frozen=True, slots=True)
class RatioCI:
    """One figure of an evictor over the baseline's on the same seeds: the pooled ratio, its paired
    bootstrap 95 % interval, and the verdict: "worse" or "better" only when the interval excludes 1."""

    ratio: float | None
    lo: float | None
    hi: float | None
    verdict: str  # "worse" | "better" | "same" (the interval holds 1, or the figure is unknown)

    def document(self) -> dict[str, object]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 3)

        return {"ratio": r(self.ratio), "ci95": [r(self.lo), r(self.hi)], "verdict": self.verdict}

    def text(self) -> str:
        if self.ratio is None:
            return "-"
        if self.lo is None or self.hi is None:
            return f"{self.ratio:.3f}"
        return f"{self.ratio:.3f} [{self.lo:.3f}, {self.hi:.3f}]"


def _verdict(key: str, lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return "same"
    if key in HIGHER_BETTER:
        return "worse" if hi < 1.0 else "better" if lo > 1.0 else "same"
    return "worse" if lo > 1.0 else "better" if hi < 1.0 else "same"


def ratio_cis(
    runs: Sequence[RunSample], base: Sequence[RunSample], *, seed: int = 0, resamples: int = BOOTSTRAP
) -> dict[str, RatioCI]:
    """Per judged figure, `runs` over `base` (the same seeds, in the same order): the pooled ratio and
    its paired bootstrap interval. Deterministic for a given `seed`."""
    if len(runs) != len(base) or not runs:
        raise ValueError("the runs and the baseline must cover the same seeds")
    point_x, point_b = pooled(runs), pooled(base)
    rng = np.random.default_rng(seed)
    n = len(runs)
    boot: dict[str, list[float]] = {k: [] for k in JUDGED}
    if n > 1:
        for _ in range(resamples):
            idx = rng.integers(0, n, n)
            x = pooled([runs[i] for i in idx])
            b = pooled([base[i] for i in idx])
            for k in JUDGED:
                q = ratio(x[k], b[k])
                if q is not None:
                    boot[k].append(q)
    out: dict[str, RatioCI] = {}
    for k in JUDGED:
        q = ratio(point_x[k], point_b[k])
        vals = boot[k]
        if q is None or not vals:
            out[k] = RatioCI(q, None, None, "same")
            continue
        # Quantiles that are resampled values (no interpolation: a ratio may be infinite).
        lo, hi = (float(v) for v in np.quantile(np.array(vals), [0.025, 0.975], method="inverted_cdf"))
        out[k] = RatioCI(q, lo, hi, _verdict(k, lo, hi))
    return out
