"""The scheduling benchmark's report: markdown tables, the target checks, and a goodput plot."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.bench import capacity
from loadgen.bench.capacity import CapacityFloor
from loadgen.bench.scheduling_types import (
    BERTH,
    GOODPUT_TARGET,
    PROFILE,
    TASK_TYPES,
    BenchConfig,
    RunResult,
    split,
)
from loadgen.engine_sim.profiles import get_profile
from loadgen.workloads.base import TaskSpec
from loadgen.workloads.coding import CodingWorkload

OVERALL_MARGIN = 0.10  # berth's overall goodput over the best baseline at the heaviest load
TASK_TOLERANCE = 0.02  # no task type worse than the best baseline by more than this
ENDPOINT_RATIO = 0.7  # Aladdin: berth's fewest endpoints <= this x least-outstanding's
FLOOR_SAMPLE = 20_000  # tasks drawn to size the capacity floor


@functools.cache
def _tasks(pattern: str) -> tuple[TaskSpec, ...]:
    return tuple(capacity.sample(CodingWorkload(pattern), FLOOR_SAMPLE))


def _floor(pattern: str, rate: float, goodput: float) -> CapacityFloor:
    return capacity.floor(get_profile(PROFILE), _tasks(pattern), rate, goodput)


def load_line(pattern: str, rates: Sequence[float], endpoints: tuple[int, int]) -> str:
    """How busy the fleet would be at each rate if its engines were ideal (`loadgen.bench.capacity`)."""
    parts = []
    for rate in rates:
        a, b = _floor(pattern, rate, 1.0).utilization(endpoints)
        parts.append(f"{rate:g} tasks/s: model a {a:.0%}, model b {b:.0%}")
    return (
        f"Offered load as the busy share of ideal engines ({endpoints[0]}+{endpoints[1]} endpoints, full "
        "batches, no idle, every task served): " + "; ".join(parts) + "."
    )


def ratio_fleet(baseline_fewest: int) -> int:
    """The most endpoints that meet the ratio target against a baseline that needs `baseline_fewest`."""
    return int(baseline_fewest * ENDPOINT_RATIO + 1e-9)


def floor_lines(
    pattern: str, rate: float, fewest: dict[str, int | None], runs: Sequence[RunResult] = ()
) -> list[str]:
    """The capacity floor beside Aladdin's search: the fewest endpoints any router could use, how busy
    ideal engines would be on the fleet the ratio target asks for, and each policy's goodput there."""
    fl = _floor(pattern, rate, GOODPUT_TARGET)
    a, b = fl.endpoints
    out = [
        f"- capacity floor (ideal engines: full batches, no idle; the costliest {1 - GOODPUT_TARGET:.0%} of "
        f"tasks given up): {fl.busy[0]:.2f} model-a and {fl.busy[1]:.2f} model-b endpoint-seconds per "
        f"second, so no router can keep goodput >= {GOODPUT_TARGET} on fewer than {a}+{b} = {fl.total} "
        "endpoints"
    ]
    base = [n for p, n in fewest.items() if p != BERTH and n is not None]
    if base:
        n = ratio_fleet(base[0])
        na, nb = split(n)
        ua, ub = fl.utilization((na, nb))
        da, db = fl.utilization((na, nb), every_task=False)
        there = [f"{r.policy} {_f(r.overall_goodput)}" for r in runs if r.endpoints == (na, nb)]
        out.append(
            f"- the ratio target means <= {n} endpoints ({na}+{nb}): ideal engines would be busy "
            f"{ua:.0%} / {ub:.0%} serving every task, {da:.0%} / {db:.0%} with the costliest "
            f"{1 - GOODPUT_TARGET:.0%} given up" + (f"; goodput there: {', '.join(there)}" if there else "")
        )
    return out


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.0f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def run_row(r: RunResult) -> list[str]:
    t = r.tasks
    return [
        f"{r.rate:g}",
        str(r.seed),
        r.policy,
        _f(r.overall_goodput),
        *(_f(t.get(k, {}).get("goodput")) for k in TASK_TYPES),
        _ms(t.get("completion", {}).get("latency_p95_ms")),
        _ms(t.get("generation", {}).get("latency_p95_ms")),
        _ms(t.get("summarization", {}).get("latency_p95_ms")),
        _ms(t.get("translation", {}).get("latency_p95_ms")),
        _f(r.utilization, 2),
        _f(r.busy_share, 2),
        f"{_pct(r.cpu['berth']['cpu_share'])} / {_pct(r.cpu['berth']['runqueue_share'])}",
        f"{_pct(r.cpu['loadgen']['cpu_share'])} / {_pct(r.cpu['loadgen']['runqueue_share'])}",
        f"{_pct(r.cpu['sim']['cpu_share'])} / {_pct(r.cpu['sim']['runqueue_share'])}",
        "yes" if r.valid else "NO",
    ]


HEADER = [
    "rate",
    "seed",
    "policy",
    "goodput",
    "compl",
    "gen",
    "summ",
    "trans",
    "p95 TTFT compl",
    "p95 TTFT gen",
    "p95 E2E summ",
    "p95 E2E trans",
    "util",
    "busy",
    "berth cpu/wait",
    "loadgen cpu/wait",
    "sim cpu/wait",
    "valid",
]


@dataclass(frozen=True, slots=True)
class PolicyMean:
    """A policy's runs at one rate, averaged over their seeds."""

    policy: str
    goodput: float
    low: float  # the smallest and largest goodput of a single run
    high: float
    tasks: dict[str, float]  # task type -> mean goodput (over the runs that report it)
    runs: int


def policy_means(runs: Sequence[RunResult]) -> list[PolicyMean]:
    """Per policy (first-seen order), the mean of its runs' goodputs; runs without a goodput are left out."""
    out: list[PolicyMean] = []
    for policy in dict.fromkeys(r.policy for r in runs):
        mine = [r for r in runs if r.policy == policy and r.overall_goodput is not None]
        if not mine:
            continue
        goodputs = [r.overall_goodput or 0.0 for r in mine]
        tasks: dict[str, float] = {}
        for t in TASK_TYPES:
            vals = [g for r in mine if (g := r.tasks.get(t, {}).get("goodput")) is not None]
            if vals:
                tasks[t] = sum(vals) / len(vals)
        out.append(
            PolicyMean(policy, sum(goodputs) / len(goodputs), min(goodputs), max(goodputs), tasks, len(mine))
        )
    return out


def target_check(runs: Sequence[RunResult], pattern: str) -> list[str]:
    """At the heaviest rate of `pattern`: berth vs the best baseline, overall and per task type (each
    policy's mean over its seeds)."""
    mine = [r for r in runs if r.pattern == pattern]
    if not mine:
        return []
    rate = max(r.rate for r in mine)
    at = [r for r in mine if r.rate == rate]
    means = policy_means(at)
    berth = next((m for m in means if m.policy == BERTH), None)
    base = [m for m in means if m.policy != BERTH]
    if berth is None or not base:
        return [f"- {pattern}: nothing to compare"]
    best = max(base, key=lambda m: m.goodput)
    diff = berth.goodput - best.goodput
    ok = diff >= OVERALL_MARGIN
    seeds = ""
    if berth.runs > 1 or best.runs > 1:
        seeds = (
            f" (means of {berth.runs} and {best.runs} seeds; single runs: berth {berth.low:.3f}-"
            f"{berth.high:.3f}, {best.policy} {best.low:.3f}-{best.high:.3f})"
        )
    out = [
        f"- {pattern} at {rate:g} tasks/s: berth {berth.goodput:.3f} vs best baseline "
        f"{best.policy} {best.goodput:.3f}: {diff:+.3f} "
        f"({'MET' if ok else 'NOT MET'}: target +{OVERALL_MARGIN:.2f}){seeds}"
    ]
    worst: tuple[float, str, str] | None = None
    for t, b in berth.tasks.items():
        others = [m.tasks[t] for m in base if t in m.tasks]
        if not others:
            continue
        top = max(others)
        d = b - top
        if worst is None or d < worst[0]:
            worst = (d, t, f"{b:.3f} vs {top:.3f}")
    if worst is not None:
        d, t, text = worst
        out.append(
            f"  - worst task type vs the best baseline for it: {t} {text} ({d:+.3f}; "
            f"{'MET' if d >= -TASK_TOLERANCE else 'NOT MET'}: target >= -{TASK_TOLERANCE:.2f})"
        )
    invalid = [r.policy for r in at if not r.valid]
    if invalid:
        out.append(f"  - NOT VALID: CPU-starved runs in this comparison: {', '.join(invalid)}")
    return out


def markdown(
    cfg: BenchConfig, runs: Sequence[RunResult], aladdin: dict[str, Any] | None, elapsed: float
) -> str:
    lines = [
        "# berth scheduling benchmark",
        "",
        f"Simulated fleet: 2 models x {cfg.endpoints_per_model} endpoints (fleet-7b, priority scheduling), "
        f"simulators at speed x{cfg.speed:g}; {cfg.duration_s:g} simulated seconds of Poisson arrivals per "
        f"run, seed{'s' if cfg.seeds > 1 else ''} {', '.join(map(str, cfg.seed_list()))}; "
        "latencies in simulated ms. Load average at the end "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
        f"elapsed {elapsed / 60:.1f} min.",
        "",
        "goodput: tasks that met their task SLA / all tasks (per task type in the next four columns). "
        "p95 latencies are task-level (TTFT tasks: to the first token of the last call; "
        "E2E tasks: to its end). "
        "util: share of 2-s samples in which an endpoint ran anything (CATO); busy: engine busy time / wall. "
        "cpu/wait: share of one core used / share of the run spent waiting for a CPU.",
        "",
    ]
    for pattern in cfg.patterns:
        rows = [run_row(r) for r in runs if r.pattern == pattern]
        if not rows:
            continue
        lines += [f"## coding:{pattern}", ""]
        lines += _table(HEADER, rows)
        n = cfg.endpoints_per_model
        lines += ["", load_line(pattern, cfg.rates_for(pattern), (n, n)), ""]
    lines += ["## Targets (heaviest load)", ""]
    for pattern in cfg.patterns:
        lines += target_check(runs, pattern)
    lines += [""]
    if aladdin is not None:
        ratio_note = f"target <= {ENDPOINT_RATIO}"
        lines += [
            f"## Fewest endpoints for goodput >= 0.95 at {aladdin['rate']:g} tasks/s ({aladdin['pattern']})",
            "",
        ]
        fewest = aladdin["fewest"]
        for policy, n in fewest.items():
            lines.append(f"- {policy}: {n if n is not None else 'not reached within the search range'}")
        vals = list(fewest.values())
        if len(vals) == 2 and all(v is not None for v in vals):
            ratio = vals[0] / vals[1]
            lines.append(
                f"- ratio {ratio:.2f} ({'MET' if ratio <= ENDPOINT_RATIO else 'NOT MET'}: {ratio_note})"
            )
        searched = [RunResult.from_dict(d) for d in aladdin["runs"]]
        lines += floor_lines(aladdin["pattern"], aladdin["rate"], fewest, searched)
        lines += [""]
        rows = []
        for r in searched:
            rows.append([f"{r.endpoints[0]}+{r.endpoints[1]}", *run_row(r)[1:]])  # seed onwards
        lines += _table(["endpoints", *HEADER[1:]], rows)
        lines += [""]
    return "\n".join(lines)


def plot(runs: Sequence[RunResult], path: Path) -> str | None:
    """Goodput against rate per policy and pattern; None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'berth[plot]')"
    patterns = sorted({r.pattern for r in runs})
    if not patterns:
        return "no plot: no runs"
    fig, axes = plt.subplots(1, len(patterns), figsize=(6 * len(patterns), 4.5), squeeze=False)
    for ax, pattern in zip(axes[0], patterns, strict=True):
        for policy in sorted({r.policy for r in runs}):
            rates = sorted({r.rate for r in runs if r.pattern == pattern and r.policy == policy})
            pts = [
                (rate, m.goodput)
                for rate in rates
                for m in policy_means(
                    [r for r in runs if r.pattern == pattern and r.policy == policy and r.rate == rate]
                )
            ]
            if pts:
                ax.plot([x for x, _ in pts], [y or 0.0 for _, y in pts], marker="o", label=policy)
        ax.set_title(f"coding:{pattern}")
        ax.set_xlabel("tasks/s")
        ax.set_ylabel("task goodput")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
