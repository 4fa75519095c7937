"""Prefix-cache benchmark: berth's SLO presets with and without prefix awareness against the
baselines, the cache-aware routers' rule and an oracle, on engines with prefix caching; the offline
fleet simulator first, then (`--live`) one confirming run with the real routers over HTTP.

    berth-loadgen bench prefix --out DIR                 # the simulated comparison (default: 5 seeds)
    berth-loadgen bench prefix --quick --out DIR         # one workload, one load, 2 seeds (seconds)
    berth-loadgen bench prefix --workloads chat,coding --loads 0.8,1.2 --seeds 5 --out DIR
    berth-loadgen bench prefix --live --out DIR          # berth, vllm-router and sglang-router, live

Setup (`loadgen.bench.scheduling.prefix_setup`): one model on `--endpoints` (8) simulated engines of the
long-context profile `fleet-8b-long` with automatic prefix caching (16-token blocks, 262k KV tokens);
berth with the profile as its prior and the KV capacity for its prefix index. Workloads: a
Mooncake-format trace (`--trace`, by default the Mooncake FAST'25 synthetic trace beside the
repository; SLO TTFT 5 s, ATGT 200 ms sent as headers), `coding` with 16 repository sessions,
multi-turn `chat`, and `sharegpt-like` as the control (no shared prefixes). Each is driven at offered
loads ρ (`--loads`): the engine time the schedule would cost a fleet with no prefix cache, per endpoint
and second; the built-in workloads' rate and the trace's time scale follow from ρ. Every configuration
of a (workload, load, seed) replays the same schedule (its fingerprint is in the report).

Configurations (`prefix_setup.CONFIGS`): `berth` (the workload's preset: `coding-assistant` for coding,
`chat-and-batch` otherwise; approximate index), `berth-no-prefix` (the same, prefix awareness off),
`oracle` (the same preset reading every engine's true cache: precise knowledge without event lag),
`day-one` (the preset, endpoints by URL only: no prior, default cap, approximate index), `free-prefill`
(the preset on engines, and with a prior, whose prefill costs nothing per token: what no prefix cache
can beat, so a goodput target above it is out of prefix awareness's reach), and the peers' policies:
`prefix-affinity` (vllm-router's and sglang-router's `cache_aware` rule), least outstanding, power of
two, round robin.

Figures per run: goodput (share of requests that met their SLO), TTFT p50/p90/p99, E2E p50/p90,
throughput (output tokens/s), the engines' own prefix-cache hit rate (hit tokens / queried tokens, as
vLLM's counters count them). Means over the seeds with 95 % Student t intervals.

Targets (`prefix_report`), at the first load where the best peer's goodput falls below 0.90 (the
heaviest load when it never does), on each workload with shared prefixes: berth >= best peer + 0.10
goodput and TTFT p90 <= 0.5x the best peer's; berth's engine hit rate >= 0.75x the oracle's
(approximate; the precise 0.9x is judged on the live path, where events have a lag); on the control,
prefix awareness costs <= 0.01 goodput at every load; day one >= the best peer at every load. Beside
each workload the report gives the offered load without caches and with a perfect shared cache: a
target past what a perfect cache allows is a capacity question, and the report says which way it
should move.

Output: DIR/report.md, DIR/report.json, DIR/goodput.png (matplotlib), per run DIR/runs/TAG/ (the fleet,
gateway and policy files and the run's figures).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import config_or_reason, say
from loadgen.bench.scheduling.prefix_bound import goodput_bound, ttft_floor_ms
from loadgen.bench.scheduling.prefix_report import figures, markdown, passed, plot, summarize_runs
from loadgen.bench.scheduling.prefix_setup import (
    CONFIGS,
    DEFAULT_ENDPOINTS,
    MODEL,
    PROFILE,
    TRACE_PROFILE,
    WORKLOADS,
    Load,
    bound,
    fingerprint,
    fleet_file,
    gateway_toml,
    load_for,
    policy_text,
    profile_for,
    schedule,
    trace_path,
    workload_arg,
    workload_options,
)
from loadgen.bench.skeleton import run_bench
from loadgen.engine_sim.fleet import load_fleet_file
from loadgen.engine_sim.profiles import get_profile
from loadgen.fleetsim import SimOptions, simulate
from loadgen.workloads.base import TaskSpec

DEFAULT_LOADS: Final = (1.0, 2.0, 3.0)
DEFAULT_SEEDS: Final = 5
DEFAULT_DURATION_S: Final = 60.0
QUICK: Final[dict[str, Any]] = {
    "workloads": ("chat",),
    "loads": (1.0,),
    "seeds": 2,
    "duration_s": 20.0,
}
DRAIN_S: Final = 120.0


@dataclass(frozen=True, slots=True)
class Config:
    out: Path
    workloads: tuple[str, ...] = tuple(WORKLOADS)
    loads: tuple[float, ...] = DEFAULT_LOADS
    seeds: int = DEFAULT_SEEDS
    duration_s: float = DEFAULT_DURATION_S
    endpoints: int = DEFAULT_ENDPOINTS
    configs: tuple[str, ...] = tuple(CONFIGS)
    trace: Path = field(default_factory=lambda: trace_path(None))
    quick: bool = False
    profile: str | None = None  # every workload's engine profile (None: `prefix_setup.profile_for`)


# --------------------------------------------------------------------- one run
def sim_options(
    cfg: Config, workload: str, at: Load, seed: int, config: str, *, d: Path
) -> tuple[SimOptions, list[TaskSpec]]:
    """One configuration's simulator options on one (workload, load, seed), its files written to `d`, and
    the schedule it replays (`loadgen.diag.prefix_misses` reads the same run request by request)."""
    d.mkdir(parents=True, exist_ok=True)
    spec = CONFIGS[config]
    profile = profile_for(workload, cfg.profile)
    free = spec.free_prefill
    (d / "fleet.toml").write_text(fleet_file(cfg.endpoints, profile, free_prefill=free))
    (d / "gateway.toml").write_text(gateway_toml(day_one=spec.day_one, profile=profile, free_prefill=free))
    (d / "policy.toml").write_text(policy_text(workload, config))
    tasks = schedule(workload, cfg.trace, at, cfg.duration_s, seed)
    span = max((t.at_s for t in tasks), default=0.0) if workload == "mooncake" else cfg.duration_s
    opts = SimOptions(
        policy=d / "policy.toml",
        fleet=tuple(load_fleet_file(d / "fleet.toml")),
        gateway=d / "gateway.toml",
        workload=workload_arg(workload, cfg.trace),
        rate=at.rate,
        duration_s=max(span, 1.0),
        seed=seed,
        models=(MODEL,),
        slo_headers=True,
        request_timeout_s=DRAIN_S + span,
        stall_timeout_s=DRAIN_S,
        drain_timeout_s=DRAIN_S,
        schedule=tuple(tasks),
        workload_options=workload_options(workload, time_scale=at.time_scale),
        prefix=spec.prefix,
    )
    return opts, tasks


def run_one(cfg: Config, workload: str, at: Load, seed: int, config: str) -> dict[str, Any]:
    """One configuration on one (workload, load, seed), on the fleet simulator."""
    t0 = time.perf_counter()
    d = cfg.out / "runs" / f"{workload}-l{at.load:g}-s{seed}-{config}"
    opts, tasks = sim_options(cfg, workload, at, seed, config, d=d)
    run: dict[str, Any] = {
        "workload": workload,
        "load": at.load,
        "rate": round(at.rate, 4),
        "time_scale": None if at.time_scale is None else round(at.time_scale, 4),
        "seed": seed,
        "config": config,
        "schedule": fingerprint(tasks),
        **figures(simulate(opts)),
    }
    run["wall_s"] = round(time.perf_counter() - t0, 1)
    (d / "figures.json").write_bytes(orjson.dumps(run, option=orjson.OPT_INDENT_2))
    return run


def run_line(r: dict[str, Any]) -> str:
    hit = r["hit_rate"]
    return (
        f"{r['workload']:13s} load {r['load']:g} seed {r['seed']} {r['config']:17s}: "
        f"goodput {r['goodput']}, TTFT p90 {r['ttft_p90_ms']} ms, "
        f"hit {'n/a' if hit is None else f'{hit:.3f}'} ({r['wall_s']:.0f} s)"
    )


# --------------------------------------------------------------------- the benchmark
def bench(cfg: Config, log: Callable[[str], None] = print) -> dict[str, Any]:
    started = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    bounds: dict[str, dict[str, Any]] = {}
    for workload in cfg.workloads:
        for load in cfg.loads:
            profile = profile_for(workload, cfg.profile)
            at = load_for(workload, cfg.trace, load, cfg.duration_s, cfg.endpoints, profile_name=profile)
            tasks = schedule(workload, cfg.trace, at, cfg.duration_s, 0)
            # over the arrivals' span (a conversation's turns run on)
            b = bound(tasks, None, cfg.endpoints, 0, profile_name=profile)
            best = goodput_bound(tasks, get_profile(profile), cfg.endpoints, 0)
            bounds[f"{workload}@{load:g}"] = {
                "load": b.load,
                "load_perfect_cache": b.load_perfect_cache,
                "reusable_share": b.reusable_share,
                "goodput_bound": best.document(),
                "ttft_p90_floor_ms": round(ttft_floor_ms(tasks, get_profile(profile), 0), 1),
            }
            for seed in range(cfg.seeds):
                for config in cfg.configs:
                    r = run_one(cfg, workload, at, seed, config)
                    runs.append(r)
                    log(run_line(r))
    result: dict[str, Any] = {
        "setup": {
            "model": MODEL,
            "profile": {w: profile_for(w, cfg.profile) for w in cfg.workloads},
            "endpoints": cfg.endpoints,
            "workloads": list(cfg.workloads),
            "loads": list(cfg.loads),
            "seeds": cfg.seeds,
            "duration_s": cfg.duration_s,
            "configs": list(cfg.configs),
            "trace": cfg.trace.name,
            "quick": cfg.quick,
            "elapsed_s": round(time.perf_counter() - started, 1),
        },
        "bounds": bounds,
        "runs": runs,
    }
    result["summary"] = summarize_runs(runs)
    md, verdicts = markdown(result)
    result["verdicts"] = verdicts
    (cfg.out / "report.md").write_text(md)
    plotted = plot(result, cfg.out / "goodput.png")
    result["plot"] = "goodput.png" if plotted is None else plotted
    (cfg.out / "report.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    log(md)
    return result


# --------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth-loadgen bench prefix", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="report directory")
    p.add_argument("--quick", action="store_true", help="chat only, one load, 2 seeds, 20 s")
    p.add_argument("--workloads", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    p.add_argument("--loads", help="offered loads (busy share of a fleet without caches), comma-separated")
    p.add_argument("--seeds", type=int)
    p.add_argument("--duration", type=float, help="seconds of arrivals (the trace is replayed whole)")
    p.add_argument("--endpoints", type=int)
    p.add_argument("--configs", help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument(
        "--profile", help=f"engine profile for every workload (default: {PROFILE}, the trace {TRACE_PROFILE})"
    )
    p.add_argument("--trace", help="a Mooncake-format trace (default: the synthetic trace beside the repo)")
    p.add_argument("--live", action="store_true", help="the live confirmation with the real routers")
    p.add_argument("--routers", help="live: comma-separated routers (default: all)")
    return p


def _pick(given: str | None, known: Sequence[str], what: str) -> tuple[str, ...] | None:
    if not given:
        return None
    chosen = [x.strip() for x in given.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in known]
    if unknown:
        raise ValueError(f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)}")
    return tuple(chosen)


def config_from_args(a: argparse.Namespace) -> Config:
    base: dict[str, Any] = dict(QUICK) if a.quick else {}
    if (w := _pick(a.workloads, tuple(WORKLOADS), "workloads")) is not None:
        base["workloads"] = w
    if (c := _pick(a.configs, tuple(CONFIGS), "configurations")) is not None:
        base["configs"] = c
    if a.loads:
        base["loads"] = tuple(float(x) for x in a.loads.split(","))
    if a.seeds is not None:
        base["seeds"] = a.seeds
    if a.duration is not None:
        base["duration_s"] = a.duration
    if a.endpoints is not None:
        base["endpoints"] = a.endpoints
    if a.profile:
        get_profile(a.profile)  # a known name, or the error lists them
        base["profile"] = a.profile
    cfg = Config(out=a.out, quick=a.quick, trace=trace_path(a.trace), **base)
    if not cfg.loads or min(cfg.loads) <= 0 or cfg.seeds < 1 or cfg.duration_s <= 0 or cfg.endpoints < 1:
        raise ValueError("need loads > 0, seeds >= 1, duration > 0 and endpoints >= 1")
    if "mooncake" in cfg.workloads and not cfg.trace.exists():
        raise ValueError(f"no trace at {cfg.trace} (give one with --trace PATH)")
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.live:
        from loadgen.bench.scheduling.prefix_live import (
            main_live,  # the live path's imports only when asked for
        )

        return main_live(args)
    cfg = config_or_reason(lambda: config_from_args(args))
    return run_bench(BENCHMARKS["prefix"], cfg, lambda c: bench(c, log=say), passed=passed)


if __name__ == "__main__":
    sys.exit(main())
