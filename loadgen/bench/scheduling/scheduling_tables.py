"""The scheduling benchmark's tables: every run's row, the means per rate and policy, tuned against
day-one side by side, the day-one presets against the best baseline, and the setup paragraph.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Final

from loadgen.bench.scheduling.scheduling_stats import policy_means
from loadgen.bench.scheduling.scheduling_types import (
    BASELINES,
    BERTH,
    CONFIGS,
    DAY_ONE,
    DAY_ONE_TOLERANCE,
    PRESETS,
    PROFILE,
    TASK_TYPES,
    TUNED,
    BenchConfig,
    RunResult,
)


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
    """Day one: each shipped preset run in the day-one configuration against the best
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
