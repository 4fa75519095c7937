"""The scheduling benchmark's report: markdown tables, the target checks, and a goodput plot."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loadgen.bench.scheduling import capacity
from loadgen.bench.scheduling.capacity import CapacityFloor
from loadgen.bench.scheduling.scheduling_types import (
    BASELINES,
    BERTH,
    CONFIGS,
    DAY_ONE,
    DAY_ONE_TOLERANCE,
    GOODPUT_TARGET,
    PRESETS,
    PROFILE,
    TASK_TYPES,
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


def _run_cells(r: RunResult) -> list[str]:
    """The cells every run table starts with: rate, seed, policy, goodput overall and per task type, the
    task types' p95 latencies and utilization."""
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
    ]


def run_row(r: RunResult) -> list[str]:
    return [
        *_run_cells(r),
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


def sim_row(r: RunResult) -> list[str]:
    return [
        *_run_cells(r),
        str(r.berth_rejections),
        f"{r.wall_s:.1f}",
    ]


SIM_HEADER = [*HEADER[:13], "rejected", "wall s"]


def _rows(runs: Sequence[RunResult]) -> tuple[list[str], list[list[str]]]:
    """A run table's header and rows: the live columns (CPU, validity) unless every run was simulated."""
    if runs and all(r.mode == "sim" for r in runs):
        return SIM_HEADER, [sim_row(r) for r in runs]
    return HEADER, [run_row(r) for r in runs]


MEANS_HEADER = [
    "rate",
    "policy",
    "seeds",
    "goodput",
    "compl",
    "gen",
    "summ",
    "trans",
    "util",
    "rejected",
    "wall s",
]


def means_rows(runs: Sequence[RunResult], rates: Sequence[float]) -> list[list[str]]:
    """Per rate and policy: mean goodput ± 95 % CI half-width, overall and per task type."""
    rows: list[list[str]] = []
    for rate in rates:
        for m in policy_means([r for r in runs if r.rate == rate]):
            rows.append(
                [
                    f"{rate:g}",
                    m.policy,
                    str(m.runs),
                    m.goodput_ci.text(),
                    *(m.task_ci[t].text() if t in m.task_ci else "-" for t in TASK_TYPES),
                    _f(m.utilization, 2),
                    f"{m.rejected:.0f}",
                    f"{m.wall_s:.1f}",
                ]
            )
    return rows


def side_by_side(runs: Sequence[RunResult], pattern: str, rates: Sequence[float]) -> list[list[str]]:
    """Per rate and policy, the tuned and the day-one configuration's mean goodput, and berth's lead
    over the policy in each."""
    rows: list[list[str]] = []
    for rate in rates:
        at = [r for r in runs if r.pattern == pattern and r.rate == rate]
        by_config = {
            c: {m.policy: m for m in policy_means([r for r in at if r.config == c])} for c in CONFIGS
        }
        for policy in dict.fromkeys(r.policy for r in at):
            row = [f"{rate:g}", policy]
            for c in CONFIGS:
                m = by_config[c].get(policy)
                berth = by_config[c].get(BERTH)
                row.append("-" if m is None else m.goodput_ci.text())
                lead = (
                    "-"
                    if m is None or berth is None or policy == BERTH
                    else f"{berth.goodput - m.goodput:+.3f}"
                )
                row.append(lead)
            rows.append(row)
    return rows


def day_one_table(runs: Sequence[RunResult], pattern: str) -> tuple[list[list[str]], list[bool]]:
    """Issue 14's day one: each shipped preset run in the day-one configuration against the best
    baseline there, at every rate (PASS when its mean is at least the best baseline's), and at the
    heaviest rate against its own tuned configuration (PASS within DAY_ONE_TOLERANCE). Rows and the
    verdicts (True: pass)."""
    mine = [r for r in runs if r.pattern == pattern]
    rates = sorted({r.rate for r in mine})
    presets = [p for p in (BERTH, *PRESETS) if any(r.policy == p for r in mine)]
    rows: list[list[str]] = []
    verdicts: list[bool] = []
    for rate in rates:
        at = [r for r in mine if r.rate == rate]
        day = {m.policy: m for m in policy_means([r for r in at if r.config == DAY_ONE])}
        tuned = {m.policy: m for m in policy_means([r for r in at if r.config == TUNED])}
        base = [day[b] for b in BASELINES if b in day]
        if not base:
            continue
        best = max(base, key=lambda m: m.goodput)
        for p in presets:
            m = day.get(p)
            if m is None:
                continue
            lead = m.goodput - best.goodput
            ok = lead >= -1e-9
            verdicts.append(ok)
            own = "-"
            if rate == rates[-1] and p in tuned:
                diff = m.goodput - tuned[p].goodput
                near = diff >= -DAY_ONE_TOLERANCE - 1e-9
                verdicts.append(near)
                own = f"{tuned[p].goodput_ci.text()} ({diff:+.3f}, {'PASS' if near else 'FAIL'})"
            name = "coding-assistant (berth)" if p == BERTH else p
            rows.append(
                [
                    f"{rate:g}",
                    name,
                    m.goodput_ci.text(),
                    f"{best.policy} {best.goodput_ci.text()}",
                    f"{lead:+.3f} {'PASS' if ok else 'FAIL'}",
                    own,
                ]
            )
    return rows, verdicts


DAY_ONE_HEADER: Final = (
    "rate",
    "preset",
    "day-one goodput",
    "best baseline (day-one)",
    "lead",
    f"own tuned config (day-one minus tuned; >= -{DAY_ONE_TOLERANCE:g}), heaviest rate",
)


def _config_title(config: str) -> str:
    return {
        TUNED: "tuned configuration",
        DAY_ONE: "day-one configuration",
    }.get(config, config)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _setup_lines(cfg: BenchConfig, runs: Sequence[RunResult], elapsed: float | None) -> list[str]:
    sim = bool(runs) and all(r.mode == "sim" for r in runs)
    seeds = cfg.seed_list()
    walls = [r.wall_s for r in runs]
    wall = (
        f"wall time per run {sum(walls) / len(walls):.2f} s mean ({min(walls):.2f}-{max(walls):.2f} s)"
        if walls
        else "no runs"
    )
    n = cfg.endpoints_per_model
    if sim:
        where = (
            f"Ran on the offline fleet simulator (`loadgen.fleetsim`: berth's scheduler core, admission, SLO "
            f"resolution and telemetry on a virtual clock in front of sans-IO engine models; `--live` runs "
            f"the same comparisons over HTTP). Fleet: 2 models x {n} `{PROFILE}` endpoints"
        )
    else:
        where = (
            f"Ran live: berth and the engine simulator as processes, simulators at speed x{cfg.speed:g}; "
            f"latencies in simulated ms. Fleet: 2 models x {n} `{PROFILE}` endpoints"
        )
    out = [
        f"{where}; {cfg.duration_s:g} simulated seconds of Poisson arrivals per run; "
        f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} per comparison ({', '.join(map(str, seeds))}); "
        f"{len(runs)} runs in the sweep, {wall}"
        + ("" if elapsed is None else f"; elapsed {_duration(elapsed)} in all")
        + (
            "."
            if sim
            else f"; load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())} on "
            f"{os.cpu_count()} CPUs."
        ),
        "",
        "Configurations: **tuned** = every endpoint's cap at its engine's max_num_seqs, priority scheduling "
        "in the engines and berth, the fleet profile as the performance-model prior, long queues, scrapes "
        "every 2 simulated s; **day-one** = endpoints given by URL only (default cap 64, no prior, FCFS "
        "engines, so no priorities), every other gateway setting at its default.",
        "",
    ]
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
