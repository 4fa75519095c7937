"""`berth-loadgen bench eviction [--quick] --out DIR`: CACE against LRU eviction in the fleet simulator.

CACE's setting (papers/ALGORITHMS.md §3): 8 small completion models and 8 large reasoning models (one of
each per language), on one node with 4 devices that cannot hold them all; the `multi-model` workload's
three patterns (uniform, ide-heavy, popularity-skewed), Poisson arrivals. For every pattern and seed the
same trace runs twice, once with the `lru` evictor and once with `cace`; everything else is the gateway's
own code (scheduler, lifecycle state machine, evictor plugins) on the virtual clock, with the node agent
simulated (load times, memory, one load per device; see `loadgen.fleetsim.lifecycle`).

Figures per pattern (seeds pooled): evictions, model hit rate, load seconds, TTFT mean and P99 for
completion and reasoning requests, E2E mean and P99. Targets (printed PASS/FAIL): CACE's evictions ≤ 0.45×
LRU's and its mean TTFT ≤ 0.5× LRU's on at least two patterns, and on no pattern worse than LRU on any
figure. Writes report.json and report.md to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gateway.core.types import ModelName
from gateway.lifecycle.instances import DeviceSpec, LifecycleSettings, ModelSpec, NodeSpec
from loadgen.bench.entry import run_bench, say
from loadgen.bench.eviction_oracle import BeladyEvictor, trace_arrivals
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim.lifecycle import LifecycleOptions, build_evictor
from loadgen.fleetsim.options import SimOptions
from loadgen.fleetsim.sim import simulate
from loadgen.report import Report
from loadgen.workloads.multi_model import LANGUAGES, PATTERNS

GIB = 1 << 30
EVICTORS = ("lru", "cace")  # judged: cace against lru
ORACLE = "belady"  # the clairvoyant bound (loadgen.bench.eviction_oracle), shown beside them


@dataclass(frozen=True, slots=True)
class Setting:
    """The fleet and the models (sizes and load times in the proportions of CACE's setting)."""

    devices: int = 4
    device_gib: float = 48.0  # 4 × 48 GiB hold 3/4 of the 16 models' 256 GiB
    small_gib: float = 8.0  # completion models
    large_gib: float = 24.0  # reasoning models
    small_load_s: float = 4.0
    large_load_s: float = 20.0
    small_profile: str = "fleet-7b"
    large_profile: str = "fleet-13b"
    churn_guard_s: float = 5.0
    drain_timeout_s: float = 10.0
    load_deadline_s: float = 120.0
    stop_s: float = 2.0

    def models(self) -> list[ModelSpec]:
        small = [
            ModelSpec(ModelName(f"code-{lang}"), int(self.small_gib * GIB), 1, self.small_load_s)
            for lang in LANGUAGES
        ]
        large = [
            ModelSpec(ModelName(f"reason-{lang}"), int(self.large_gib * GIB), 1, self.large_load_s)
            for lang in LANGUAGES
        ]
        return small + large  # the workload's slots: 0-7 completion, 8-15 reasoning

    def fleet(self) -> tuple[EndpointSpec, ...]:
        return tuple(
            EndpointSpec(
                models=(m.name,),
                id=m.name,
                profile=self.small_profile if m.name.startswith("code-") else self.large_profile,
                node="n1",
            )
            for m in self.models()
        )

    def node(self) -> NodeSpec:
        return NodeSpec(
            "n1", tuple(DeviceSpec(f"gpu{i}", int(self.device_gib * GIB)) for i in range(self.devices))
        )


@dataclass(frozen=True, slots=True)
class BenchConfig:
    out: Path
    patterns: tuple[str, ...]
    seeds: tuple[int, ...]
    rate: float
    duration_s: float
    cace_params: dict[str, float]
    oracle: bool = True  # also run the clairvoyant bound


def sim_options(setting: Setting, pattern: str, evictor: str, seed: int, cfg: BenchConfig) -> SimOptions:
    """One run: `evictor` is `lru`, `cace` (with the config's parameters) or `belady` (the oracle, on
    this run's own trace); at every eviction the other two online evictors' picks are compared."""
    opts = _sim_options(setting, pattern, evictor, seed, cfg)
    assert opts.lifecycle is not None
    online = {name: build_evictor(name, cfg.cace_params if name == "cace" else {}) for name in EVICTORS}
    life = dataclasses.replace(opts.lifecycle, compare=tuple(e for n, e in online.items() if n != evictor))
    if evictor == ORACLE:
        life = dataclasses.replace(life, evictor_impl=BeladyEvictor(trace_arrivals(opts)))
    return dataclasses.replace(opts, lifecycle=life)


def _sim_options(setting: Setting, pattern: str, evictor: str, seed: int, cfg: BenchConfig) -> SimOptions:
    return SimOptions(
        policy=None,
        fleet=setting.fleet(),
        workload=f"multi-model:{pattern}",
        rate=cfg.rate,
        duration_s=cfg.duration_s,
        seed=seed,
        models=tuple(m.name for m in setting.models()),
        lifecycle=LifecycleOptions(
            models=tuple(setting.models()),
            nodes=(setting.node(),),
            evictor=evictor if evictor in EVICTORS else "lru",
            evictor_params=cfg.cace_params if evictor == "cace" else {},
            settings=LifecycleSettings(
                load_deadline_s=setting.load_deadline_s,
                churn_guard_s=setting.churn_guard_s,
                drain_timeout_s=setting.drain_timeout_s,
            ),
            stop_s=setting.stop_s,
        ),
    )


def _mean_ms(xs: Sequence[float]) -> float | None:
    return round(statistics.fmean(xs) * 1000.0, 1) if xs else None


def _p99_ms(xs: Sequence[float]) -> float | None:
    return round(float(np.percentile(xs, 99)) * 1000.0, 1) if xs else None


def figures(reports: Sequence[Report]) -> dict[str, Any]:
    """The figures of one pattern and evictor, pooled over seeds."""
    ttft: dict[str, list[float]] = {"completion": [], "reasoning": []}
    e2e: list[float] = []
    n = errors = 0
    evictions = loads = 0
    load_s = 0.0
    hits = 0.0
    diag = dict.fromkeys(("plans", "with_choice", "candidates", "demand_known", "demand_queued"), 0)
    differs: dict[str, int] = {}
    for rep in reports:
        for r in rep.requests:
            n += 1
            if not r.ok:
                errors += 1
                continue
            if r.ttft_s is not None and r.cls in ttft:
                ttft[r.cls].append(r.ttft_s)
            if r.e2e_s is not None:
                e2e.append(r.e2e_s)
        lc = rep.data["lifecycle"]
        evictions += lc["evictions"]
        loads += lc["loads"]
        load_s += lc["load_seconds"]
        hits += (lc["hit_rate"] or 0.0) * len(rep.requests)
        ep = lc["eviction_plans"]
        diag["plans"] += ep["n"]
        for k in ("with_choice", "candidates", "demand_known", "demand_queued"):
            diag[k] += ep[k]
        for k, v in ep["differs"].items():
            differs[k] = differs.get(k, 0) + v
    all_ttft = ttft["completion"] + ttft["reasoning"]
    return {
        "requests": n,
        "errors": errors,
        "evictions": evictions,
        "loads": loads,
        "load_seconds": round(load_s, 1),
        "hit_rate": round(hits / n, 4) if n else None,
        "ttft_mean_ms": _mean_ms(all_ttft),
        "ttft_completion_mean_ms": _mean_ms(ttft["completion"]),
        "ttft_completion_p99_ms": _p99_ms(ttft["completion"]),
        "ttft_reasoning_mean_ms": _mean_ms(ttft["reasoning"]),
        "ttft_reasoning_p99_ms": _p99_ms(ttft["reasoning"]),
        "e2e_mean_ms": _mean_ms(e2e),
        "e2e_p99_ms": _p99_ms(e2e),
        # Diagnostics: eviction plans, those with more than one evictable instance, the evictable
        # instances summed over the plans and those with a known or predicted next request, and the
        # plans where another evictor would have picked other victims on the same state.
        **diag,
        "differs": dict(sorted(differs.items())),
    }


#: Figures where lower is better (hit rate: higher is better); all must not be worse under CACE.
LOWER_BETTER = (
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


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if b == 0:
        return 0.0 if a == 0 else float("inf")
    return round(a / b, 3)


#: The targets (issue 15, from CACE's reported −55 % evictions and −70 % mean TTFT).
EVICTIONS_RATIO_TARGET = 0.45
TTFT_RATIO_TARGET = 0.5


def _worse_on(a: dict[str, Any], base: dict[str, Any]) -> list[str]:
    worse = [k for k in LOWER_BETTER if (a[k] or 0) > (base[k] or 0)]
    if (a["hit_rate"] or 0) < (base["hit_rate"] or 0):
        worse.append("hit_rate")
    return worse


def judge(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Targets: evictions ≤ 0.45× and mean TTFT ≤ 0.5× LRU's on ≥ 2 patterns; no figure worse anywhere.
    The oracle's ratios (when it ran) are given beside them: what any evictor could reach here."""
    per_pattern: dict[str, Any] = {}
    strong = oracle_strong = 0
    never_worse = True
    for pattern, by in results.items():
        lru, cace = by["lru"], by["cace"]
        ev = _ratio(cace["evictions"], lru["evictions"])
        tt = _ratio(cace["ttft_mean_ms"], lru["ttft_mean_ms"])
        worse = _worse_on(cace, lru)
        meets = ev is not None and tt is not None and ev <= EVICTIONS_RATIO_TARGET and tt <= TTFT_RATIO_TARGET
        strong += meets
        never_worse = never_worse and not worse
        per_pattern[pattern] = {
            "evictions_ratio": ev,
            "ttft_mean_ratio": tt,
            "meets_ratios": meets,
            "worse_on": worse,
        }
        oracle = by.get(ORACLE)
        if oracle is not None:
            oev = _ratio(oracle["evictions"], lru["evictions"])
            ott = _ratio(oracle["ttft_mean_ms"], lru["ttft_mean_ms"])
            omeets = (
                oev is not None
                and ott is not None
                and oev <= EVICTIONS_RATIO_TARGET
                and ott <= TTFT_RATIO_TARGET
            )
            oracle_strong += omeets
            per_pattern[pattern].update(
                oracle_evictions_ratio=oev,
                oracle_ttft_mean_ratio=ott,
                oracle_meets_ratios=omeets,
                # How much of the gap from LRU to the oracle CACE closes (1: all of it).
                evictions_gap_closed=_gap_closed(cace["evictions"], lru["evictions"], oracle["evictions"]),
                ttft_gap_closed=_gap_closed(
                    cace["ttft_mean_ms"], lru["ttft_mean_ms"], oracle["ttft_mean_ms"]
                ),
            )
    out: dict[str, Any] = {
        "patterns": per_pattern,
        "ratios_on_two_patterns": strong >= 2,
        "never_worse": never_worse,
        "pass": strong >= 2 and never_worse,
    }
    if any(ORACLE in by for by in results.values()):
        out["oracle_ratios_on_two_patterns"] = oracle_strong >= 2
    return out


def _gap_closed(x: float | None, lru: float | None, oracle: float | None) -> float | None:
    if x is None or lru is None or oracle is None or lru <= oracle:
        return None
    return round((lru - x) / (lru - oracle), 3)


def _pct(part: int, whole: int) -> str:
    return f"{part} of {whole} ({100.0 * part / whole:.0f} %)" if whole else f"{part} of 0"


def render_md(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    st = cfg["setting"]
    lines = [
        "# Eviction: CACE vs LRU (fleet simulator), with Belady's clairvoyant bound",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"Setting: {st['devices']} devices × {st['device_gib']:g} GiB; 8 completion models "
        f"({st['small_gib']:g} GiB, load {st['small_load_s']:g} s) and 8 reasoning models "
        f"({st['large_gib']:g} GiB, load {st['large_load_s']:g} s); churn guard {st['churn_guard_s']:g} s. "
        f"Poisson {cfg['rate']:g} req/s for {cfg['duration_s']:g} s, seeds {cfg['seeds']}, pooled. "
        f"CACE params: {cfg['cace_params'] or 'defaults'}. `{ORACLE}` evicts the model whose next request "
        "comes last, reading the run's own trace: no online evictor can do that; it bounds what any "
        "evictor could gain here.",
        "",
    ]
    keys = ["requests", "errors", "evictions", "loads", "load_seconds", "hit_rate", *LOWER_BETTER[3:]]
    for pattern, by in doc["results"].items():
        j = doc["verdict"]["patterns"][pattern]
        oracle = by.get(ORACLE)
        head = "| figure | lru | cace |" + (f" {ORACLE} |" if oracle else "") + " cace/lru |"
        head += f" {ORACLE}/lru |" if oracle else ""
        lines += [f"## {pattern}", "", head, "| --- |" + " ---: |" * (head.count("|") - 2)]
        for k in keys:
            a, b = by["lru"][k], by["cace"][k]
            row = f"| {k} | {a} | {b} |"
            if oracle:
                row += f" {oracle[k]} |"
            row += f" {_ratio(b, a) if k != 'requests' else ''} |"
            if oracle:
                row += f" {_ratio(oracle[k], a) if k != 'requests' else ''} |"
            lines.append(row)
        lines += [
            "",
            f"evictions ratio {j['evictions_ratio']}, mean TTFT ratio {j['ttft_mean_ratio']}; "
            f"worse than LRU on: {', '.join(j['worse_on']) or 'nothing'}",
        ]
        if oracle:
            lines.append(
                f"{ORACLE}: evictions ratio {j['oracle_evictions_ratio']}, mean TTFT ratio "
                f"{j['oracle_ttft_mean_ratio']}; share of the LRU→{ORACLE} gap CACE closes: evictions "
                f"{j['evictions_gap_closed']}, mean TTFT {j['ttft_gap_closed']}"
            )
        for name in (*EVICTORS, *([ORACLE] if oracle else [])):
            f = by[name]
            other = ", ".join(f"{o} {_pct(n, f['plans'])}" for o, n in f["differs"].items())
            lines.append(
                f"- {name}: evictions with a choice (more than one instance evictable) "
                f"{_pct(f['with_choice'], f['plans'])}; evictable instances whose next request was "
                f"known or predicted {_pct(f['demand_known'], f['candidates'])} (queued: "
                f"{_pct(f['demand_queued'], f['candidates'])}); other victims on the "
                f"same state by {other or '-'}"
            )
        lines.append("")
    v = doc["verdict"]
    lines += [
        "## Targets",
        "",
        f"- evictions ≤ {EVICTIONS_RATIO_TARGET}× and mean TTFT ≤ {TTFT_RATIO_TARGET}× LRU's on ≥ 2 "
        f"patterns: {'PASS' if v['ratios_on_two_patterns'] else 'FAIL'}",
        f"- no pattern worse than LRU on any figure: {'PASS' if v['never_worse'] else 'FAIL'}",
    ]
    if "oracle_ratios_on_two_patterns" in v:
        lines.append(
            f"- (bound) {ORACLE} meets the ratios on ≥ 2 patterns: "
            f"{'yes' if v['oracle_ratios_on_two_patterns'] else 'no: no evictor can, in this setting'}"
        )
    lines.append("")
    return "\n".join(lines)


def bench(cfg: BenchConfig, log: Callable[[str], None], *, setting: Setting | None = None) -> dict[str, Any]:
    s = setting or Setting()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for pattern in cfg.patterns:
        results[pattern] = {}
        for evictor in (*EVICTORS, *([ORACLE] if cfg.oracle else [])):
            reports = [simulate(sim_options(s, pattern, evictor, seed, cfg)) for seed in cfg.seeds]
            results[pattern][evictor] = f = figures(reports)
            log(
                f"{pattern:18s} {evictor:6s} evictions={f['evictions']:4d} hit={f['hit_rate']} "
                f"load_s={f['load_seconds']} ttft_mean={f['ttft_mean_ms']}ms e2e_p99={f['e2e_p99_ms']}ms "
                f"errors={f['errors']} choice={f['with_choice']}/{f['plans']} differs={f['differs']}"
            )
    verdict = judge(results)
    doc = {
        "command": "berth-loadgen bench eviction " + " ".join(cfg_argv(cfg)),
        "config": {
            "patterns": list(cfg.patterns),
            "seeds": list(cfg.seeds),
            "rate": cfg.rate,
            "duration_s": cfg.duration_s,
            "cace_params": cfg.cace_params,
            "setting": {k: getattr(s, k) for k in s.__dataclass_fields__},
        },
        "results": results,
        "verdict": verdict,
    }
    cfg.out.mkdir(parents=True, exist_ok=True)
    (cfg.out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    (cfg.out / "report.md").write_text(render_md(doc))
    log(
        f"target evictions ≤ {EVICTIONS_RATIO_TARGET}× and mean TTFT ≤ {TTFT_RATIO_TARGET}× LRU's on ≥ 2 "
        f"patterns: {'PASS' if verdict['ratios_on_two_patterns'] else 'FAIL'}"
    )
    log(f"target no pattern worse than LRU on any figure: {'PASS' if verdict['never_worse'] else 'FAIL'}")
    if "oracle_ratios_on_two_patterns" in verdict:
        log(
            f"bound: {ORACLE} meets the ratios on ≥ 2 patterns: "
            f"{'yes' if verdict['oracle_ratios_on_two_patterns'] else 'no'}"
        )
    for pattern, j in verdict["patterns"].items():
        worse = ", ".join(j["worse_on"]) or "-"
        line = (
            f"  {pattern}: evictions ×{j['evictions_ratio']}, "
            f"mean TTFT ×{j['ttft_mean_ratio']}, worse on {worse}"
        )
        if "oracle_evictions_ratio" in j:
            line += (
                f"; {ORACLE}: evictions ×{j['oracle_evictions_ratio']}, "
                f"mean TTFT ×{j['oracle_ttft_mean_ratio']}"
            )
        log(line)
    log(f"wrote {cfg.out / 'report.md'} and report.json")
    return doc


def cfg_argv(cfg: BenchConfig) -> list[str]:
    return [
        "--out",
        str(cfg.out),
        "--rate",
        f"{cfg.rate:g}",
        "--duration-s",
        f"{cfg.duration_s:g}",
        "--seeds",
        ",".join(map(str, cfg.seeds)),
        *([] if cfg.oracle else ["--no-oracle"]),
        *(a for k, v in cfg.cace_params.items() for a in ("--cace", f"{k}={v:g}")),
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth-loadgen bench eviction", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quick", action="store_true", help="shorter runs, two seeds")
    p.add_argument("--rate", type=float, default=None, help="requests per second (default 0.5)")
    p.add_argument(
        "--duration-s", type=float, default=None, help="arrivals for this long (default 600; quick 180)"
    )
    p.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; quick 0,1)")
    p.add_argument("--patterns", default=",".join(PATTERNS))
    p.add_argument(
        "--cace", action="append", default=[], metavar="KEY=VALUE", help="a CACE parameter (repeatable)"
    )
    p.add_argument("--no-oracle", action="store_true", help=f"skip the clairvoyant bound ({ORACLE})")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig | str:
    patterns = tuple(p for p in args.patterns.split(",") if p)
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown:
        return f"unknown pattern(s) {', '.join(unknown)} (known: {', '.join(PATTERNS)})"
    try:
        seeds = tuple(int(x) for x in (args.seeds or ("0,1" if args.quick else "0,1,2")).split(","))
        params = {k: float(v) for k, v in (kv.split("=", 1) for kv in args.cace)}
    except ValueError as e:
        return f"bad --seeds or --cace: {e}"
    return BenchConfig(
        out=args.out,
        patterns=patterns,
        seeds=seeds,
        rate=args.rate if args.rate is not None else 0.5,
        duration_s=args.duration_s if args.duration_s is not None else (180.0 if args.quick else 600.0),
        cace_params=params,
        oracle=not args.no_oracle,
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(build_parser().parse_args(argv))
    return run_bench(
        "eviction", cfg, lambda c: bench(c, log=say), passed=lambda doc: bool(doc["verdict"]["pass"])
    )


if __name__ == "__main__":
    sys.exit(main())
