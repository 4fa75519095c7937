"""The operator's what-if: the coding fleet at ten times the traffic, on 200 endpoints over two models.

    berth-loadgen bench whatif --out DIR                       # both patterns, ~5 minutes on one core
    berth-loadgen bench whatif --patterns pattern1 --out DIR
    berth-loadgen bench whatif --endpoints 400 --scale 20 --out DIR

The scheduling benchmark's setting (`policies`: `fleet-7b` endpoints serving `code-a-7b`
and `code-b-7b`, the `coding` workload) grown to 200 endpoints and ten times its traffic: for each pattern,
ten times the highest rate that benchmark runs its 12-endpoint fleet at (pattern1 10.5 tasks/s -> 105,
pattern2 7.5 -> 75). The endpoints split between the models as the scheduling benchmark's Aladdin search
splits them (`split`: 80 % serve model a, whose calls are about five sixths of the work): 160 + 40.
Everything else is the scheduling benchmark's tuned setup at speed 1: priority scheduling in the engines,
berth's cap at the engines' seats, the profile as the `[telemetry.prior]`. Policies: `coding-assistant`
as shipped and least outstanding with the coding class table (`scheduling.policy_file`), on the same
trace (same seed).

Every run goes through the files an operator would write, which the benchmark leaves in DIR (`fleet.toml`,
`gateway.toml`, the baseline's policy file), and the report gives the `berth-loadgen sim` command that
reruns each one from them (same seed, same report but its wall-clock figures).

Output: `DIR/report.md` and `DIR/report.json` (the simulator's "left out" list first), each run's full
report in `DIR/runs/`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import say
from loadgen.bench.scheduling import capacity
from loadgen.bench.scheduling.scheduling_setup import policy_file
from loadgen.bench.scheduling.scheduling_types import BERTH, DEFAULT_RATES, MODELS, PROFILE, TASK_TYPES, split
from loadgen.bench.skeleton import run_bench
from loadgen.engine_sim.fleet import load_fleet_file
from loadgen.engine_sim.profiles import get_profile
from loadgen.fleetsim import SimOptions, simulate
from loadgen.fleetsim.sim import LEFT_OUT
from loadgen.report import TaskResult
from loadgen.workloads import get_workload
from loadgen.workloads.base import TaskMix

JSQ: Final = "least-outstanding"
WHATIF_POLICIES: Final = (BERTH, JSQ)
ENDPOINTS: Final = 200
SCALE: Final = 10.0
DEFAULT_PATTERNS: Final = ("pattern1", "pattern2")
DURATION_S: Final = 120.0  # the scheduling benchmark's run length
DRAIN_S: Final = 30.0  # ... and its drain
SEED: Final = 1


@dataclass(frozen=True, slots=True)
class WhatIfConfig:
    out: Path
    endpoints: int = ENDPOINTS
    scale: float = SCALE
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    duration_s: float = DURATION_S
    seed: int = SEED

    def rate(self, pattern: str) -> float:
        """`scale` × the highest rate the scheduling benchmark runs `pattern` at."""
        return round(self.scale * max(DEFAULT_RATES[pattern]), 6)


def fleet_toml(n_a: int, n_b: int) -> str:
    prof = get_profile(PROFILE)
    lines = [
        f"# {n_a + n_b} simulated endpoints: {n_a} serving {MODELS[0]}, {n_b} serving {MODELS[1]}",
        "[defaults]",
        f'profile = "{PROFILE}"',
        'scheduling_policy = "priority"  # berth sends each request its urgency',
        "load_time_s = 0.0",
        f"cap = {prof.max_num_seqs}  # berth's cap: the engine's max_num_seqs",
        "",
    ]
    for model, n, prefix in zip(MODELS, (n_a, n_b), ("a", "b"), strict=True):
        if n:
            lines += ["[[endpoints]]", f'models = ["{model}"]', f"count = {n}", f'id = "{prefix}"', ""]
    return "\n".join(lines)


def gateway_toml() -> str:
    """The scheduling benchmark's tuned settings at speed 1 (its endpoints come from the fleet file)."""
    prof = get_profile(PROFILE)
    lat = prof.latency
    return "\n".join(
        [
            "# berth's settings for the what-if (the [[endpoints]] come from fleet.toml)",
            "[limits]",
            "max_queue_per_model = 8192",
            "max_queue_wait_s = 600.0",
            f"default_endpoint_cap = {prof.max_num_seqs}",
            "[scrape]",
            "interval_s = 2.0",
            "stale_after_s = 10.0",
            "[telemetry]",
            "refresh_interval_s = 1.0",
            f"kv_capacity_tokens = {prof.kv_capacity_tokens}",
            "[telemetry.prior]         # the engines' profile: an operator's profiling step",
            f"k1 = {lat.k1:.6g}",
            f"c1 = {lat.c1:.6g}",
            f"k2 = {lat.k2:.6g}",
            f"c2 = {lat.c2:.6g}",
            f"c3 = {lat.c3:.6g}",
            "h = 1.0",
            "j = 1.0",
            "",
        ]
    )


def _rel(path: Path) -> str:
    """`path` as given on a command line: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def sim_command(opts: SimOptions, fleet: Path, out: Path) -> str:
    """The `berth-loadgen sim` command line that reruns `opts`, its fleet read from `fleet`."""
    if opts.policy is None or opts.gateway is None or opts.models is None:
        raise ValueError("a what-if run names its policy, gateway file and models")
    args = [
        "berth-loadgen",
        "sim",
        "--policy",
        _rel(opts.policy),
        "--fleet",
        _rel(fleet),
        "--gateway",
        _rel(opts.gateway),
        "--workload",
        opts.workload,
        "--rate",
        f"{opts.rate:g}",
        "--duration",
        f"{opts.duration_s:g}",
        "--seed",
        str(opts.seed),
        "--models",
        ",".join(opts.models),
        "--drain-timeout",
        f"{opts.drain_timeout_s:g}",
        "--out",
        _rel(out),
    ]
    return shlex.join(args)


def summarize(
    policy: str, pattern: str, rate: float, data: dict[str, Any], results: Sequence[TaskResult]
) -> dict[str, Any]:
    tasks = data.get("tasks", {})
    n = len(results)
    met = sum(1 for t in results if t.met)
    classes = data.get("classes", {})
    sim = data["simulation"]
    return {
        "pattern": pattern,
        "rate": rate,
        "policy": policy,
        "tasks": n,
        "task_goodput": round(met / n, 4) if n else None,
        "by_type": {k: tasks[k]["goodput"] for k in TASK_TYPES if k in tasks},
        "ttft_p95_ms": data["overall"]["ttft_p95_ms"],
        "completion_ttft_p95_ms": classes.get("completion", {}).get("ttft_p95_ms"),
        "request_goodput": data["overall"]["goodput"],
        "refused": sum(data.get("rejections_by_reason", {}).values()),
        "utilization": data["fleet"]["utilization"],
        "queued_max": data["fleet"]["queued_max"],
        "wall_s": sim["wall_s"],
        "events": sim["events"],
        "requests": data["overall"]["count"],
        "requests_per_s": sim["requests_per_s"],
    }


def bench(cfg: WhatIfConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    started = time.perf_counter()
    out = cfg.out
    (out / "runs").mkdir(parents=True, exist_ok=True)
    n_a, n_b = split(cfg.endpoints)
    (out / "fleet.toml").write_text(fleet_toml(n_a, n_b))
    (out / "gateway.toml").write_text(gateway_toml())
    specs = tuple(load_fleet_file(out / "fleet.toml"))
    policies = {p: policy_file(p, out) for p in WHATIF_POLICIES}
    profile = get_profile(PROFILE)
    log(f"whatif: {n_a} + {n_b} endpoints, {cfg.scale:g}x the scheduling benchmark's traffic, out {out}")
    rows: list[dict[str, Any]] = []
    commands: list[str] = []
    loads: dict[str, dict[str, Any]] = {}
    for pattern in cfg.patterns:
        rate = cfg.rate(pattern)
        workload = get_workload(f"coding:{pattern}")
        assert isinstance(workload, TaskMix)
        floor = capacity.floor(profile, capacity.sample(workload, seed=0), rate)
        loads[pattern] = {
            "rate": rate,
            "floor_endpoints": list(floor.endpoints),
            "ideal_busy_share": [round(x, 3) for x in floor.utilization((n_a, n_b))],
        }
        for policy in WHATIF_POLICIES:
            opts = SimOptions(
                policy=policies[policy],
                fleet=specs,
                gateway=out / "gateway.toml",
                workload=f"coding:{pattern}",
                rate=rate,
                duration_s=cfg.duration_s,
                seed=cfg.seed,
                models=MODELS,
                drain_timeout_s=DRAIN_S,
            )
            path = out / "runs" / f"{pattern}-{policy}.json"
            commands.append(sim_command(opts, out / "fleet.toml", path))
            report = simulate(opts)
            report.write(path)
            row = summarize(policy, pattern, rate, report.data, report.tasks)
            rows.append(row)
            log(
                f"  {pattern} {rate:g} tasks/s {policy:18} task goodput {row['task_goodput']} "
                f"util {row['utilization']} wall {row['wall_s']:.1f}s"
            )
    doc: dict[str, Any] = {
        "left_out": list(LEFT_OUT),
        "config": {
            "endpoints": {MODELS[0]: n_a, MODELS[1]: n_b},
            "profile": PROFILE,
            "scale": cfg.scale,
            "patterns": list(cfg.patterns),
            "duration_sim_s": cfg.duration_s,
            "seed": cfg.seed,
            "policies": {p: _rel(policies[p]) for p in WHATIF_POLICIES},
            "engine_scheduling": "priority",
            "cap": profile.max_num_seqs,
        },
        "load": loads,
        "runs": rows,
        "commands": commands,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    (out / "report.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    text = markdown(doc)
    (out / "report.md").write_text(text)
    log(text)
    return doc


def _f(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def markdown(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    eps = cfg["endpoints"]
    total = sum(eps.values())
    out = [f"# What-if: {total} endpoints, {cfg['scale']:g}x the coding traffic", ""]
    out += ["What the simulator leaves out:", ""] + [f"- {x}" for x in doc["left_out"]] + [""]
    out += [
        "## Setup",
        "",
        f"- fleet: {', '.join(f'{n} × `{m}`' for m, n in eps.items())} on `{cfg['profile']}` engines "
        f"(priority scheduling, berth's cap {cfg['cap']} = max_num_seqs, the profile as [telemetry.prior]);",
        f"- workload `coding`, Poisson arrivals at {cfg['scale']:g}x the scheduling benchmark's highest "
        f"rate, {cfg['duration_sim_s']:g} simulated s, seed {cfg['seed']}, the same trace for both policies;",
        "- policies: " + ", ".join(f"{p} `{f}`" for p, f in cfg["policies"].items()) + ".",
        "",
        "Offered load: the capacity floor (ideal engines, full batches: `capacity`) per model,",
        "and the busy share it would give this fleet:",
        "",
        "| pattern | tasks/s | floor (a + b) | ideal busy share (a / b) |",
        "| --- | --- | --- | --- |",
    ]
    for pattern, load in doc["load"].items():
        fa, fb = load["floor_endpoints"]
        ua, ub = load["ideal_busy_share"]
        out.append(f"| {pattern} | {load['rate']:g} | {fa} + {fb} | {ua:.2f} / {ub:.2f} |")
    types = [t for t in TASK_TYPES if any(t in r["by_type"] for r in doc["runs"])]
    header = ["pattern", "policy", "task goodput", *types]
    header += ["TTFT p95 ms (all / completion)", "refused", "busy share", "wall s"]
    out += ["", "## Results", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in doc["runs"]:
        per = " | ".join(_f(r["by_type"].get(t)) for t in types)
        ttft = f"{_f(r['ttft_p95_ms'], 0)} / {_f(r['completion_ttft_p95_ms'], 0)}"
        out.append(
            f"| {r['pattern']} | {r['policy']} | {_f(r['task_goodput'])} | {per} | {ttft} | {r['refused']} | "
            f"{_f(r['utilization'])} | {r['wall_s']:.1f} |"
        )
    out += [
        "",
        "Task goodput: tasks that met their SLA; per task type the same; TTFT p95 over every request (all) "
        "and over code completions; refused: berth's 429s; busy share: endpoints running at least one "
        "request, sampled every 2 simulated s (CATO's utilization); wall s: the simulation's own time.",
        "",
        "## Rerun one",
        "",
        "```sh",
        *doc["commands"],
        "```",
        "",
        f"The benchmark took {doc['wall_s']:g} s.",
        "",
    ]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth-loadgen bench whatif", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench-whatif"), help="output directory")
    p.add_argument("--endpoints", type=int, default=ENDPOINTS, help="endpoints over both models")
    p.add_argument("--scale", type=float, default=SCALE, help="times the scheduling benchmark's traffic")
    p.add_argument("--patterns", default=",".join(DEFAULT_PATTERNS), help="coding patterns")
    p.add_argument("--duration", type=float, default=DURATION_S, help="simulated s of arrivals")
    p.add_argument("--seed", type=int, default=SEED)
    return p


def config_from_args(args: argparse.Namespace) -> WhatIfConfig | str:
    patterns = tuple(x.strip() for x in args.patterns.split(",") if x.strip())
    unknown = [x for x in patterns if x not in DEFAULT_RATES]
    if unknown or not patterns:
        return f"unknown patterns: {', '.join(unknown) or '(none given)'} (known: {', '.join(DEFAULT_RATES)})"
    if args.endpoints < 2 or args.scale <= 0 or args.duration <= 0:
        return "--endpoints must be >= 2, --scale and --duration > 0"
    return WhatIfConfig(
        out=args.out,
        endpoints=args.endpoints,
        scale=args.scale,
        patterns=patterns,
        duration_s=args.duration,
        seed=args.seed,
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(build_parser().parse_args(argv))
    return run_bench(BENCHMARKS["whatif"], cfg, lambda c: bench(c, log=say))


if __name__ == "__main__":
    sys.exit(main())
