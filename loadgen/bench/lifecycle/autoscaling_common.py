"""What the autoscaling benchmark's settings share: the result shape every setting returns, arrivals with
bursts, per-run figures from a simulation report, and means with confidence intervals."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadgen.bench.scheduling.scheduling_stats import MeanCI, mean_ci
from loadgen.report import Report


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    measured: str
    target: str
    passed: bool

    def document(self) -> dict[str, Any]:
        return {"name": self.name, "measured": self.measured, "target": self.target, "pass": self.passed}


@dataclass(slots=True)
class SettingResult:
    """One setting of the benchmark: its table (one row per configuration, figures as mean ± 95 % CI over
    seeds), its targets, its section of report.md, and a timeline per configuration (seed 0) to plot."""

    name: str
    title: str
    rows: list[dict[str, Any]]
    targets: list[Target]
    markdown: str
    timelines: dict[str, dict[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "meta": self.meta,
            "rows": self.rows,
            "targets": [t.document() for t in self.targets],
            "timelines": self.timelines,
        }


#: A setting: (seeds, quick) -> its result. Progress lines go to the benchmark's log.
SettingFn = Callable[[Sequence[int], bool, Callable[[str], None]], SettingResult]


@dataclass(frozen=True, slots=True)
class Burst:
    start_s: float
    length_s: float
    factor: float  # the arrival rate is multiplied by this during the burst


def bursty_arrivals(rng: random.Random, bursts: Sequence[Burst]) -> Callable[[float, float], list[float]]:
    """A Poisson process whose rate is multiplied during each burst (thinning of the peak rate); the
    workloads call it as `fn(rate, duration_s)`, like `loadgen.workloads.arrivals.arrival_fn`."""

    def factor(t: float) -> float:
        f = 1.0
        for b in bursts:
            if b.start_s <= t < b.start_s + b.length_s:
                f = max(f, b.factor)
        return f

    peak = max([1.0, *(b.factor for b in bursts)])

    def fn(rate: float, duration_s: float) -> list[float]:
        out: list[float] = []
        if rate <= 0 or duration_s <= 0:
            return out
        t = rng.expovariate(rate * peak)
        while t < duration_s:
            if rng.random() * peak < factor(t):
                out.append(t)
            t += rng.expovariate(rate * peak)
        return out

    return fn


def attainment(report: Report, cls: str | None = None) -> float | None:
    """Share of the requests (of report class `cls`) that met their SLO; failed and unfinished ones
    missed."""
    reqs = [r for r in report.requests if cls is None or r.cls == cls]
    if not reqs:
        return None
    return sum(1 for r in reqs if r.ok and r.slo_met) / len(reqs)


def task_goodput(report: Report) -> float | None:
    """Share of tasks that met their task SLA (a failed task missed it)."""
    tasks = report.tasks
    if not tasks:
        return None
    return sum(1 for t in tasks if t.ok and t.met) / len(tasks)


def scaling_figures(report: Report) -> dict[str, Any]:
    """Device-hours, peak devices, scaling actions and hysteresis, utilization and lost requests."""
    lc = report.data["lifecycle"]
    auto = lc.get("autoscale") or {}
    return {
        "device_hours": lc["device_hours"],
        "peak_devices": lc["peak_devices"],
        "scale_ups": auto.get("started", 0),
        "actions": auto.get("actions", 0),
        "hysteresis": auto.get("hysteresis"),
        "utilization": report.data["fleet"]["utilization"],
        "device_utilization": report.data["fleet"].get("device_utilization"),
        "lost_requests": lc["lost_requests"],
    }


def timeline(report: Report) -> dict[str, Any]:
    tl = report.data["fleet"]["timeline"]
    return {
        "t_s": tl["t_s"],
        "devices": tl["devices"],
        "instances_by_class": tl["instances_by_class"],
        "gateway_queued": tl["gateway_queued"],
        "busy_endpoints": tl["busy_endpoints"],
    }


def ci(values: Sequence[float | None]) -> MeanCI | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return mean_ci(vals) if vals else None


def ci_doc(c: MeanCI | None, digits: int = 4) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "mean": round(c.mean, digits),
        "ci95": None if c.half is None else round(c.half, digits),
        "n": c.n,
    }


def cell(c: MeanCI | None, digits: int = 3) -> str:
    return "n/a" if c is None else c.text(digits)


def pooled_rows(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], keys: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, MeanCI | None]]]:
    """One row per configuration with each key's mean and 95 % CI over its runs (JSON), and the same
    as MeanCI objects for the markdown and the targets."""
    rows: list[dict[str, Any]] = []
    cis: dict[str, dict[str, MeanCI | None]] = {}
    for config, rs in runs.items():
        cis[config] = {k: ci([r.get(k) for r in rs]) for k in keys}
        rows.append({"config": config, "seeds": len(rs), **{k: ci_doc(cis[config][k]) for k in keys}})
    return rows, cis


def md_table(
    cis: Mapping[str, Mapping[str, MeanCI | None]], columns: Sequence[tuple[str, str, int]]
) -> list[str]:
    """A markdown table: one row per configuration; columns (key, header, digits)."""
    lines = [
        "| configuration | " + " | ".join(h for _, h, _ in columns) + " |",
        "| --- | " + " | ".join("---:" for _ in columns) + " |",
    ]
    for config, by in cis.items():
        lines.append(f"| {config} | " + " | ".join(cell(by.get(k), d) for k, _, d in columns) + " |")
    return lines


def mean_of(c: MeanCI | None) -> float:
    return math.nan if c is None else c.mean


def run_configs(
    name: str,
    seeds: Sequence[int],
    configs: Sequence[str],
    *,
    simulate_one: Callable[[str, int], Report],
    figures: Callable[[Report], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str],
    log: Callable[[str], None],
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """Every configuration of a setting on every seed: each run's figures by configuration, and the
    first seed's timeline per configuration (for the plot). `describe` turns one run's figures into its
    progress line."""
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    timelines: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        for config in configs:
            rep = simulate_one(config, seed)
            f = figures(rep)
            runs[config].append(f)
            if seed == seeds[0]:
                timelines[config] = timeline(rep)
            log(f"{name:14s} {config:17s} seed {seed}: {describe(f)}")
    return runs, timelines
