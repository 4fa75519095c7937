"""Scheduling benchmark: berth's SLO-aware policy against round robin, power of two and least outstanding
on CATO's setting (papers/ALGORITHMS.md §1), plus Aladdin's question (the fewest endpoints that keep
goodput >= 0.95 at a fixed rate). It runs on the offline fleet simulator (`loadgen.fleetsim`) unless
`--live` asks for the real-time HTTP path.

    berth-loadgen bench scheduling                    # the default run, on the simulator (~5 min, 1 core)
    berth-loadgen bench scheduling --quick            # one pattern, its heaviest rate, 3 seeds, no search
    berth-loadgen bench scheduling --rates 8,10,12 --patterns pattern1,pattern2 --seeds 10
    berth-loadgen bench scheduling --day-one-check   # the issue's live day-one setting, simulated
    berth-loadgen bench scheduling --live --quick    # over HTTP: berth and the engines as processes
    berth-loadgen bench scheduling --merge base/ mine/ --out both/   # one report from earlier runs

Setup of every run (nothing is shared between runs, so each starts from the same state); the simulator
and the live path build it from the same functions (`scheduling_setup`; a run: `scheduling_runs`):
- a simulated fleet: two 7B-class models (`code-a-7b`, `code-b-7b`), 6 endpoints each, profile
  `fleet-7b`; on the simulator at speed 1 in virtual time, live in its own process
  (`berth-engine-sim --fleet`) sped up `--speed` times;
- berth with the policy under test: on the simulator its scheduler core, admission, SLO resolution and
  telemetry on the virtual clock (`loadgen.fleetsim`); live its own process (`berth serve`);
- the `coding` workload with the same seed, hence the same trace, for every policy of a comparison (live:
  every SLO, task SLA and client-side gap scaled by 1 / speed, every latency in the report scaled back);
- utilization is the share of 2-s samples (simulated seconds) in which an endpoint was busy (running at
  least one request), CATO's definition.

Configurations (`--configs`; both by default on the simulator, `tuned` live):
- `tuned`: every endpoint with `cap` = the engine's max_num_seqs and priority scheduling (the engines and
  berth), the performance-model prior set to the fleet's profile (an operator's profiling step), long
  queues, scrapes every 2 simulated s;
- `day-one`: as an operator starts: endpoints given by URL only (berth's default cap 64, no prior, FCFS
  engines, so berth sends no priorities), every other gateway setting at its default.

Policies: `berth` is `policies/coding-assistant.toml` as shipped. The baselines are the shipped
`policies/baseline-*.toml` with the coding-assistant's `[slo]` class table added (the workload names its
task type in x-berth-slo-class, which a policy must know; FCFS and the baselines' placement ignore it, and
they have no admission control). `--policies` may also name the other shipped presets (`default`,
`chat-and-batch`, `aladdin`, given the same class table) and variants of them (`VARIANTS`: e.g.
`aladdin-paper`, best fit in the paper's order), shown beside the preset and not judged.

Seeds and targets: every comparison runs on `--seeds` seeds (5 by default on the simulator, 3 with
`--quick`, 1 live); the report gives each policy's mean goodput (task-level, overall and per task type)
with a 95 % Student t confidence interval over the seeds, and judges the targets on the means: at the
heaviest rate of each pattern berth >= the best baseline + 0.10, and no task type more than 0.02 below
the best baseline for it (PASS / FAIL per pattern and configuration, with the CI half-widths).

Validity (live only): a comparison is valid only when neither berth nor loadgen was CPU-starved: each
used at most 80 % of a core (loadgen's CPU report) and spent at most 10 % of the run waiting for a CPU
while runnable (`/proc/PID/task/*/schedstat`: other processes on a shared machine). The simulator has no
such failure; what it leaves out is listed at the top of its report.

Capacity: beside each pattern's table the report gives the offered load as the busy share of ideal
engines (full batches, no idle time), and beside Aladdin's search (the tuned configuration, each fleet
size judged on the mean over the seeds) the capacity floor, the fewest endpoints any router could use
(`capacity`), so a ratio target past the fleet's capacity shows as such; after the search
both policies also run on the fleet the ratio target asks for (when the search did not), so the report
says how far from 0.95 each is there.

Output: `OUT/report.md` (the tables), `OUT/report.json` (every figure and the raw reports' key numbers),
`OUT/goodput.png` when matplotlib is installed, and per run `OUT/runs/TAG/` (its fleet.toml, gateway.toml,
policy and loadgen.json; a simulated run replays with `berth-loadgen sim --fleet ... --gateway ...
--policy ...`). `--record` writes each run's requests as `runs/TAG/record.jsonl` on both paths (on the
simulator rebuilt from the run's seeded schedule and the simulated client's observations).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.scheduling.scheduling_report import markdown, plot, verdict
from loadgen.bench.scheduling.scheduling_runs import SIM_SPEED
from loadgen.bench.scheduling.scheduling_search import at_ratio_fleet, fewest_endpoints, sweep
from loadgen.bench.scheduling.scheduling_types import (
    CONFIGS,
    DAY_ONE,
    DAY_ONE_CHECK,
    DEFAULT_ALADDIN_RATE,
    DEFAULT_DURATION_S,
    DEFAULT_ENDPOINTS,
    DEFAULT_PATTERNS,
    DEFAULT_RATES,
    DEFAULT_SEED,
    DEFAULT_SEEDS,
    DEFAULT_SPEED,
    LIVE_SEEDS,
    POLICIES,
    PRESETS,
    PROFILE,
    QUICK_SEEDS,
    TUNED,
    VARIANTS,
    BenchConfig,
    RunResult,
    policy_source,
)
from loadgen.bench.skeleton import run_bench


def render(
    cfg: BenchConfig, runs: list[RunResult], aladdin: dict[str, Any] | None, started: float | None
) -> str:
    return markdown(cfg, runs, aladdin, None if started is None else time.time() - started)


async def bench(cfg: BenchConfig) -> dict[str, Any]:
    cfg.out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    def log(msg: str) -> None:
        print(msg, flush=True)

    where = f"live, speed x{cfg.speed:g}" if cfg.live else "on the offline fleet simulator"
    log(
        f"scheduling benchmark {where}: {cfg.duration_s:g} simulated s per run, configurations "
        f"{', '.join(cfg.configs)}, seeds {', '.join(map(str, cfg.seed_list()))}, out {cfg.out}"
    )
    runs = await sweep(cfg, log)
    aladdin: dict[str, Any] | None = None
    if cfg.aladdin:
        fewest: dict[str, int | None] = {}
        searched: list[RunResult] = []
        for policy in cfg.aladdin_policies:
            fewest[policy], rr = await fewest_endpoints(cfg, policy, log)
            searched += rr
        searched += await at_ratio_fleet(cfg, fewest, searched, log)
        aladdin = {
            "rate": cfg.aladdin_rate,
            "pattern": cfg.aladdin_pattern,
            "config": TUNED,
            "seeds": list(cfg.seed_list()),
            "fewest": fewest,
            "runs": [r.to_dict() for r in searched],
        }
    doc = {
        "config": {
            "mode": "live" if cfg.live else "sim",
            "speed": cfg.speed if cfg.live else SIM_SPEED,
            "duration_sim_s": cfg.duration_s,
            "configs": list(cfg.configs),
            "patterns": list(cfg.patterns),
            "rates": {p: list(cfg.rates_for(p)) for p in cfg.patterns},
            "policies": {p: policy_source(p) for p in cfg.policies},
            "endpoints_per_model": cfg.endpoints_per_model,
            "seed": cfg.seed,
            "seeds": list(cfg.seed_list()),
            "profile": PROFILE,
            "note": cfg.note,
            "loadavg": list(os.getloadavg()),
            "cpus": os.cpu_count(),
        },
        "runs": [r.to_dict() for r in runs],
        "aladdin": aladdin,
        "elapsed_s": round(time.time() - started, 1),
    }
    (cfg.out / "report.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    text = render(cfg, runs, aladdin, started)
    (cfg.out / "report.md").write_text(text)
    plot_note = plot(runs, cfg.out / "goodput.png")
    log(text)
    if plot_note:
        log(plot_note)
    return doc


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="berth-loadgen bench scheduling",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("bench-scheduling"), help="output directory")
    p.add_argument(
        "--live",
        action="store_true",
        help="run over HTTP in real time (berth serve and berth-engine-sim as processes, ~70 s a run) "
        "instead of on the offline fleet simulator; defaults there: 1 seed, the tuned configuration",
    )
    p.add_argument(
        "--configs",
        default=None,
        help=f"gateway configurations, subset of {', '.join(CONFIGS)} (default: both on the simulator, "
        "tuned live)",
    )
    p.add_argument(
        "--speed", type=float, default=DEFAULT_SPEED, help="--live: the engine simulator's speed-up"
    )
    p.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="simulated s of arrivals")
    p.add_argument(
        "--rates",
        default=None,
        help="tasks/s for every pattern, comma-separated (default: per pattern, "
        + "; ".join(f"{k} {','.join(f'{r:g}' for r in v)}" for k, v in DEFAULT_RATES.items())
        + ")",
    )
    p.add_argument("--patterns", default=",".join(DEFAULT_PATTERNS))
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"subset of {', '.join([*POLICIES, *PRESETS, *VARIANTS])} (berth is coding-assistant.toml; "
        f"{', '.join(PRESETS)} are the other shipped presets, with the coding SLO classes; "
        f"{', '.join(VARIANTS)} a preset changed, shown beside it)",
    )
    p.add_argument("--endpoints", type=int, default=DEFAULT_ENDPOINTS, help="per model")
    p.add_argument("--seed", type=int, default=None, help=f"the first seed (default {DEFAULT_SEED})")
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="runs per comparison, seeds SEED, SEED+1, ...; targets use the means (default: "
        f"{DEFAULT_SEEDS} on the simulator, {QUICK_SEEDS} with --quick, {LIVE_SEEDS} with --live or "
        "--day-one-check)",
    )
    p.add_argument("--aladdin-rate", type=float, default=DEFAULT_ALADDIN_RATE)
    p.add_argument("--no-aladdin", action="store_true", help="skip the fewest-endpoints search")
    p.add_argument(
        "--record",
        action="store_true",
        help="write each run's requests to runs/TAG/record.jsonl (the simulator: rebuilt from the run's "
        "seeded schedule and its simulated client's observations)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"one pattern at its heaviest rate, no search, {QUICK_SEEDS} seeds on the simulator "
        f"(not {DEFAULT_SEEDS}; under a minute), {LIVE_SEEDS} live (~5 min)",
    )
    ref = DAY_ONE_CHECK
    p.add_argument(
        "--day-one-check",
        action="store_true",
        help=f"the issue's live day-one measurement, simulated: day-one configuration, coding:{ref.pattern} "
        f"at {ref.rate:g} tasks/s for {ref.duration_s:g} s, seed {ref.seed}, {ref.endpoints_per_model} "
        "endpoints per model, every policy, no search (--seeds, --configs, --policies still apply)",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="run nothing: one report in --out from the runs in these earlier outputs' report.json "
        "(e.g. the baselines and berth measured in separate invocations)",
    )
    return p


def merge(cfg: BenchConfig, dirs: Sequence[Path]) -> int:
    """One report from the runs (and Aladdin searches) of earlier invocations, as if run together."""
    runs: list[RunResult] = []
    aladdin: dict[str, Any] | None = None
    for d in dirs:
        doc = orjson.loads((d / "report.json").read_bytes())
        runs += [RunResult.from_dict(r) for r in doc["runs"]]
        if doc.get("aladdin"):
            aladdin = aladdin or {**doc["aladdin"], "fewest": {}, "runs": []}
            aladdin["fewest"].update(doc["aladdin"]["fewest"])
            aladdin["runs"] += doc["aladdin"]["runs"]
    patterns = tuple(dict.fromkeys(r.pattern for r in runs))
    cfg = dataclasses.replace(
        cfg,
        live=bool(runs) and all(r.mode == "live" for r in runs),
        configs=tuple(dict.fromkeys(r.config for r in runs)),
        patterns=patterns,
        rates={p: tuple(sorted({r.rate for r in runs if r.pattern == p})) for p in patterns},
        policies=tuple(dict.fromkeys(r.policy for r in runs)),
        seeds=len({r.seed for r in runs}),
        seed=min((r.seed for r in runs), default=cfg.seed),
    )
    cfg.out.mkdir(parents=True, exist_ok=True)
    doc = {"merged_from": [str(d) for d in dirs], "runs": [r.to_dict() for r in runs], "aladdin": aladdin}
    (cfg.out / "report.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    text = render(cfg, runs, aladdin, None)
    (cfg.out / "report.md").write_text(text)
    print(text)
    return 0


def config_from_args(args: argparse.Namespace) -> BenchConfig | str:
    """The benchmark's configuration from its options, or why they make none."""
    policies = _names(args.policies)
    unknown = [x for x in policies if x not in POLICIES and x not in PRESETS and x not in VARIANTS]
    if unknown:
        return f"unknown policies: {', '.join(unknown)}"
    configs = _names(args.configs) if args.configs else ((TUNED,) if args.live else CONFIGS)
    if not configs or any(c not in CONFIGS for c in configs):
        return f"--configs: expected a subset of {', '.join(CONFIGS)}"
    if args.seeds is not None and args.seeds < 1:
        return "--seeds must be at least 1"
    seeds = args.seeds or (
        LIVE_SEEDS if args.live or args.day_one_check else QUICK_SEEDS if args.quick else DEFAULT_SEEDS
    )
    cfg = BenchConfig(
        out=args.out,
        live=args.live,
        configs=configs,
        speed=args.speed,
        duration_s=args.duration,
        patterns=_names(args.patterns),
        rates={"*": _floats(args.rates)} if args.rates else dict(DEFAULT_RATES),
        policies=policies,
        endpoints_per_model=args.endpoints,
        seed=DEFAULT_SEED if args.seed is None else args.seed,
        seeds=seeds,
        aladdin=not args.no_aladdin,
        aladdin_rate=args.aladdin_rate,
        record=args.record,
    )
    if args.day_one_check:
        ref = DAY_ONE_CHECK
        cfg = dataclasses.replace(
            cfg,
            configs=configs if args.configs else (DAY_ONE,),
            patterns=(ref.pattern,),
            rates={ref.pattern: (ref.rate,)},
            duration_s=ref.duration_s,
            endpoints_per_model=ref.endpoints_per_model,
            seed=ref.seed if args.seed is None else args.seed,
            aladdin=False,
            note=f"The issue's day-one reference, {ref.measured}.",
        )
    elif args.quick:
        cfg = dataclasses.replace(
            cfg,
            patterns=cfg.patterns[:1],
            rates={p: cfg.rates_for(p)[-1:] for p in cfg.patterns[:1]},
            aladdin=False,
        )
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    if args.merge and not isinstance(cfg, str):
        return merge(cfg, args.merge)

    def run(c: BenchConfig) -> dict[str, Any]:
        import uvloop

        return uvloop.run(bench(c))

    return run_bench(BENCHMARKS["scheduling"], cfg, run, passed=passed)


def passed(doc: dict[str, Any]) -> bool:
    """Every configuration's targets at each pattern's heaviest load (`scheduling_report.verdict`)."""
    runs = [RunResult.from_dict(r) for r in doc["runs"]]
    configs = dict.fromkeys(r.config for r in runs)
    patterns = dict.fromkeys(r.pattern for r in runs)
    judged = [verdict([r for r in runs if r.config == c], p) for c in configs for p in patterns]
    return bool(judged) and all(v is not None and v.passed for v in judged)


if __name__ == "__main__":
    sys.exit(main())
