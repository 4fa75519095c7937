"""The runs the scheduling benchmark (`policies`) makes: the sweep over configurations, patterns, rates,
seeds and policies, and Aladdin's search for the fewest endpoints that keep goodput at its target."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadgen.bench.scheduling.scheduling_report import ratio_fleet
from loadgen.bench.scheduling.scheduling_runs import line, run_one
from loadgen.bench.scheduling.scheduling_types import (
    GOODPUT_TARGET,
    BenchConfig,
    RunResult,
    split,
)


# --------------------------------------------------------------------- the sweep and the search
async def sweep(cfg: BenchConfig, log: Any) -> list[RunResult]:
    out: list[RunResult] = []
    n = cfg.endpoints_per_model
    for config in cfg.configs:
        for pattern in cfg.patterns:
            for rate in cfg.rates_for(pattern):
                for seed in cfg.seed_list():
                    for policy in cfg.policies:
                        r = await run_one(
                            cfg, policy, pattern=pattern, rate=rate, n_a=n, n_b=n, seed=seed, config=config
                        )
                        log(line(r))
                        out.append(r)
    return out


async def run_seeds(cfg: BenchConfig, policy: str, n_a: int, n_b: int, log: Any) -> list[RunResult]:
    """`policy` on `n_a` + `n_b` endpoints at Aladdin's rate (tuned), once per seed."""
    out: list[RunResult] = []
    for seed in cfg.seed_list():
        r = await run_one(
            cfg, policy, pattern=cfg.aladdin_pattern, rate=cfg.aladdin_rate, n_a=n_a, n_b=n_b, seed=seed
        )
        log(line(r))
        out.append(r)
    return out


def mean_goodput(runs: Sequence[RunResult]) -> float | None:
    vals = [r.overall_goodput for r in runs if r.overall_goodput is not None]
    return sum(vals) / len(vals) if vals else None


async def fewest_endpoints(cfg: BenchConfig, policy: str, log: Any) -> tuple[int | None, list[RunResult]]:
    """The fewest endpoints (both models, split MODEL_A_SHARE) keeping overall goodput >= 0.95 (the mean
    over the seeds) at `aladdin_rate`: a binary search over 4 .. 2 × endpoints_per_model (goodput falls
    as endpoints go)."""
    runs: list[RunResult] = []
    lo, hi = 4, 2 * cfg.endpoints_per_model
    best: int | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        a, b = split(mid)
        rr = await run_seeds(cfg, policy, a, b, log)
        runs += rr
        g = mean_goodput(rr)
        if g is not None and g >= GOODPUT_TARGET:
            best, hi = mid, mid - 1
        else:
            lo = mid + 1
    return best, runs


async def at_ratio_fleet(
    cfg: BenchConfig, fewest: dict[str, int | None], done: Sequence[RunResult], log: Any
) -> list[RunResult]:
    """Each searched policy on the fleet the ratio target asks for (`ratio_fleet` of the baseline's
    fewest), unless its search ran that fleet already: how far from the goodput target each is there."""
    base = fewest.get(cfg.aladdin_policies[1])
    if base is None:
        return []
    a, b = split(ratio_fleet(base))
    ran = {(r.policy, r.endpoints) for r in done}
    out: list[RunResult] = []
    for policy in cfg.aladdin_policies:
        if (policy, (a, b)) not in ran:
            out += await run_seeds(cfg, policy, a, b, log)
    return out
