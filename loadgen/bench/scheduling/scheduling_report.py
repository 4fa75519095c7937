"""The scheduling benchmark's report: the markdown, the target checks (`verdict`), the capacity floor
beside Aladdin's search, and a goodput plot. Means over seeds are `scheduling_stats`; the tables it is
built of are `scheduling_tables`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loadgen.bench.scheduling import capacity
from loadgen.bench.scheduling.capacity import CapacityFloor
from loadgen.bench.scheduling.scheduling_stats import MeanCI, PolicyMean, mean_ci, policy_means
from loadgen.bench.scheduling.scheduling_tables import (
    DAY_ONE_HEADER,
    MEANS_HEADER,
    _config_title,
    _rows,
    _setup_lines,
    _table,
    day_one_table,
    means_rows,
    side_by_side,
)
from loadgen.bench.scheduling.scheduling_types import (
    BASELINES,
    BERTH,
    CONFIGS,
    DAY_ONE,
    GOODPUT_TARGET,
    PRESETS,
    PROFILE,
    TUNED,
    BenchConfig,
    RunResult,
    split,
)
from loadgen.engine_sim.profiles import get_profile
from loadgen.workloads.base import TaskSpec
from loadgen.workloads.coding import CodingWorkload

OVERALL_MARGIN: Final = 0.10  # berth's overall goodput over the best baseline at the heaviest load
TASK_TOLERANCE: Final = 0.02  # no task type worse than the best baseline by more than this
ENDPOINT_RATIO = 0.7  # Aladdin: berth's fewest endpoints <= this x least-outstanding's
FLOOR_SAMPLE = 20_000  # tasks drawn to size the capacity floor


@functools.cache
def _tasks(pattern: str) -> tuple[TaskSpec, ...]:
    return tuple(capacity.sample(CodingWorkload(pattern), FLOOR_SAMPLE))


def _floor(pattern: str, rate: float, goodput: float) -> CapacityFloor:
    return capacity.floor(get_profile(PROFILE), _tasks(pattern), rate, goodput)


def load_line(pattern: str, rates: Sequence[float], endpoints: tuple[int, int]) -> str:
    """How busy the fleet would be at each rate if its engines were ideal (`capacity`)."""
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
        there = [
            f"{m.policy} {m.goodput_ci.text()}"
            for m in policy_means([r for r in runs if r.endpoints == (na, nb)])
        ]
        out.append(
            f"- the ratio target means <= {n} endpoints ({na}+{nb}): ideal engines would be busy "
            f"{ua:.0%} / {ub:.0%} serving every task, {da:.0%} / {db:.0%} with the costliest "
            f"{1 - GOODPUT_TARGET:.0%} given up" + (f"; goodput there: {', '.join(there)}" if there else "")
        )
    return out


@dataclass(frozen=True, slots=True)
class TaskVerdict:
    """One task type: berth's mean against the best baseline's mean for that task type."""

    task: str
    berth: MeanCI
    best_policy: str
    best: MeanCI

    @property
    def diff(self) -> float:
        return self.berth.mean - self.best.mean

    @property
    def ok(self) -> bool:
        return self.diff >= -TASK_TOLERANCE - 1e-9


@dataclass(frozen=True, slots=True)
class Verdict:
    """The targets at the heaviest rate of one pattern, judged on the means over the seeds."""

    pattern: str
    rate: float
    berth: PolicyMean
    best: PolicyMean  # the baseline with the highest mean goodput
    paired: MeanCI | None  # berth minus that baseline seed by seed (one trace per seed); None: no pairs
    tasks: tuple[TaskVerdict, ...]
    invalid: tuple[str, ...]  # policies with a CPU-starved run (live only)

    @property
    def diff(self) -> float:
        return self.berth.goodput - self.best.goodput

    @property
    def overall_ok(self) -> bool:
        return self.diff >= OVERALL_MARGIN - 1e-9

    @property
    def tasks_ok(self) -> bool:
        return all(t.ok for t in self.tasks)

    @property
    def passed(self) -> bool:
        return self.overall_ok and self.tasks_ok

    @property
    def worst(self) -> TaskVerdict | None:
        return min(self.tasks, key=lambda t: t.diff, default=None)


def verdict(runs: Sequence[RunResult], pattern: str) -> Verdict | None:
    """The targets at the heaviest rate of `pattern` in `runs` (one configuration); None when berth or
    every baseline is missing there."""
    mine = [r for r in runs if r.pattern == pattern]
    if not mine:
        return None
    rate = max(r.rate for r in mine)
    at = [r for r in mine if r.rate == rate]
    means = policy_means(at)
    berth = next((m for m in means if m.policy == BERTH), None)
    base = [m for m in means if m.policy in BASELINES]
    if berth is None or not base:
        return None
    best = max(base, key=lambda m: m.goodput)
    pairs = [berth.by_seed[s] - g for s, g in best.by_seed.items() if s in berth.by_seed]
    tasks: list[TaskVerdict] = []
    for t, b in berth.task_ci.items():
        others = [m for m in base if t in m.task_ci]
        if others:
            top = max(others, key=lambda m: m.task_ci[t].mean)
            tasks.append(TaskVerdict(t, b, top.policy, top.task_ci[t]))
    invalid = tuple(dict.fromkeys(r.policy for r in at if not r.valid))
    return Verdict(pattern, rate, berth, best, mean_ci(pairs) if pairs else None, tuple(tasks), invalid)


def _half(c: MeanCI) -> str:
    return "-" if c.half is None else f"±{c.half:.3f}"


def target_check(runs: Sequence[RunResult], pattern: str) -> list[str]:
    """At the heaviest rate of `pattern`: PASS or FAIL, berth vs the best baseline, overall and per task
    type (each policy's mean over its seeds, with the 95 % CI half-widths beside the margins)."""
    if not any(r.pattern == pattern for r in runs):
        return []
    v = verdict(runs, pattern)
    if v is None:
        return [f"- {pattern}: nothing to compare"]
    berth, best = v.berth, v.best
    several = berth.runs > 1 or best.runs > 1
    out = [f"- {pattern} at {v.rate:g} tasks/s: **{'PASS' if v.passed else 'FAIL'}**"]
    ci = ""
    seeds = ""
    if several:
        paired = "" if v.paired is None else f", the difference {_half(v.paired)} (paired by seed)"
        ci = f"; 95 % CI: berth {_half(berth.goodput_ci)}, {best.policy} {_half(best.goodput_ci)}{paired}"
        seeds = (
            f" (means of {berth.runs} and {best.runs} seeds; single runs: berth {berth.low:.3f}-"
            f"{berth.high:.3f}, {best.policy} {best.low:.3f}-{best.high:.3f})"
        )
    out.append(
        f"  - berth {berth.goodput:.3f} vs best baseline {best.policy} {best.goodput:.3f}: {v.diff:+.3f} "
        f"({'MET' if v.overall_ok else 'NOT MET'}: target +{OVERALL_MARGIN:.2f}){ci}{seeds}"
    )
    worst = v.worst
    if worst is not None:
        out.append(
            f"  - worst task type vs the best baseline for it: {worst.task} {worst.berth.mean:.3f} vs "
            f"{worst.best.mean:.3f} ({worst.diff:+.3f}; {'MET' if worst.ok else 'NOT MET'}: target >= "
            f"-{TASK_TOLERANCE:.2f})"
        )
        for t in v.tasks:
            out.append(
                f"    - {t.task}: berth {t.berth.text()} vs {t.best_policy} {t.best.text()}: {t.diff:+.3f} "
                f"({'MET' if t.ok else 'NOT MET'})"
            )
    if v.invalid:
        out.append(f"  - NOT VALID: CPU-starved runs in this comparison: {', '.join(v.invalid)}")
    return out


def markdown(
    cfg: BenchConfig, runs: Sequence[RunResult], aladdin: dict[str, Any] | None, elapsed: float | None
) -> str:
    """The report; `elapsed` is the whole benchmark's wall time (None: a merge of earlier runs)."""
    lines = ["# berth scheduling benchmark", ""]
    if cfg.note:
        lines += [cfg.note, ""]
    left_out = list(dict.fromkeys(x for r in runs for x in r.left_out))
    if left_out:
        lines += ["What the simulator leaves out:", "", *(f"- {x}" for x in left_out), ""]
    lines += _setup_lines(cfg, runs, elapsed)
    lines += [
        "goodput: tasks that met their task SLA / all tasks (per task type in the next four columns); "
        "`a ±h`: the mean over the seeds and the half-width of its 95 % confidence interval (Student t). "
        "p95 latencies are task-level (TTFT tasks: to the first token of the last call; "
        "E2E tasks: to its end). "
        "util: share of 2-s samples in which an endpoint ran anything (CATO); busy: engine busy time / wall. "
        "cpu/wait: share of one core used / share of the run spent waiting for a CPU. "
        "rejected: requests berth refused (per run).",
        "",
    ]
    configs = [c for c in cfg.configs if any(r.config == c for r in runs)]
    lines += [
        f"## Targets (heaviest load): berth >= best baseline + {OVERALL_MARGIN:.2f}, no task type below the "
        f"best baseline for it by more than {TASK_TOLERANCE:.2f}, on the means",
        "",
    ]
    for config in configs:
        mine = [r for r in runs if r.config == config]
        lines += [f"### {_config_title(config)}", ""]
        for pattern in cfg.patterns:
            lines += target_check(mine, pattern)
        lines += [""]
    if len(configs) > 1:
        lines += [
            "## Tuned vs day-one (mean goodput ±95 % CI; berth's lead over each policy in each one)",
            "",
        ]
        header = ["rate", "policy"]
        for c in CONFIGS:
            header += [c, "berth lead"]
        for pattern in cfg.patterns:
            rows = side_by_side(runs, pattern, cfg.rates_for(pattern))
            if rows:
                lines += [f"### coding:{pattern}", "", *_table(header, rows), ""]
    if DAY_ONE in configs and any(r.policy in PRESETS or r.policy == BERTH for r in runs):
        lines += [
            "## Day one: every shipped preset with endpoints given by URL only, against the best baseline",
            "",
            "Each preset's day-one mean goodput against the best baseline's at every rate (the presets "
            "other than coding-assistant with the coding SLO classes), and at the heaviest rate against "
            "its own tuned configuration.",
            "",
        ]
        for pattern in cfg.patterns:
            rows, _ = day_one_table(runs, pattern)
            if rows:
                lines += [f"### coding:{pattern}", "", *_table(DAY_ONE_HEADER, rows), ""]
    for pattern in cfg.patterns:
        if not any(r.pattern == pattern for r in runs):
            continue
        lines += [f"## coding:{pattern}", ""]
        for config in configs:
            mine = [r for r in runs if r.pattern == pattern and r.config == config]
            if mine:
                lines += [f"{_config_title(config)}:", ""]
                lines += _table(MEANS_HEADER, means_rows(mine, cfg.rates_for(pattern)))
                lines += [""]
        n = cfg.endpoints_per_model
        lines += [load_line(pattern, cfg.rates_for(pattern), (n, n)), ""]
    if aladdin is not None:
        lines += aladdin_lines(aladdin)
    lines += ["## Every run", ""]
    for pattern in cfg.patterns:
        for config in configs:
            mine = [r for r in runs if r.pattern == pattern and r.config == config]
            if mine:
                header, rows = _rows(mine)
                lines += [f"### coding:{pattern}, {_config_title(config)}", "", *_table(header, rows), ""]
    return "\n".join(lines)


def aladdin_lines(aladdin: dict[str, Any]) -> list[str]:
    ratio_note = f"target <= {ENDPOINT_RATIO}"
    seeds = aladdin.get("seeds") or []
    judged = f" (the mean over seeds {', '.join(map(str, seeds))})" if len(seeds) > 1 else ""
    lines = [
        f"## Fewest endpoints for goodput >= 0.95{judged} at {aladdin['rate']:g} tasks/s "
        f"({aladdin['pattern']}, {_config_title(aladdin.get('config', TUNED))})",
        "",
    ]
    fewest = aladdin["fewest"]
    for policy, n in fewest.items():
        lines.append(f"- {policy}: {n if n is not None else 'not reached within the search range'}")
    vals = list(fewest.values())
    if len(vals) == 2 and all(v is not None for v in vals):
        ratio = vals[0] / vals[1]
        lines.append(f"- ratio {ratio:.2f} ({'MET' if ratio <= ENDPOINT_RATIO else 'NOT MET'}: {ratio_note})")
    searched = [RunResult.from_dict(d) for d in aladdin["runs"]]
    lines += floor_lines(aladdin["pattern"], aladdin["rate"], fewest, searched)
    lines += [""]
    header, rows = _rows(searched)
    rows = [[f"{r.endpoints[0]}+{r.endpoints[1]}", *row[1:]] for r, row in zip(searched, rows, strict=True)]
    lines += _table(["endpoints", *header[1:]], rows)
    lines += [""]
    return lines


def plot(runs: Sequence[RunResult], path: Path) -> str | None:
    """Mean goodput (95 % CI bars) against rate per policy, configuration and pattern; None when written,
    else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'berth-gateway[plot]')"
    patterns = sorted({r.pattern for r in runs})
    if not patterns:
        return "no plot: no runs"
    fig, axes = plt.subplots(1, len(patterns), figsize=(6 * len(patterns), 4.5), squeeze=False)
    configs = list(dict.fromkeys(r.config for r in runs))
    for ax, pattern in zip(axes[0], patterns, strict=True):
        for config in configs:
            style = "-" if config == TUNED else "--"
            for policy in sorted({r.policy for r in runs}):
                mine = [r for r in runs if r.pattern == pattern and r.policy == policy and r.config == config]
                rates = sorted({r.rate for r in mine})
                pts = [
                    (rate, m.goodput_ci)
                    for rate in rates
                    for m in policy_means([r for r in mine if r.rate == rate])
                ]
                if pts:
                    label = policy if len(configs) == 1 else f"{policy} ({config})"
                    ax.errorbar(
                        [x for x, _ in pts],
                        [c.mean for _, c in pts],
                        yerr=[c.half or 0.0 for _, c in pts],
                        marker="o",
                        linestyle=style,
                        capsize=3,
                        label=label,
                    )
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
