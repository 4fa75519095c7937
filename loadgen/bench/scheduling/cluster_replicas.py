"""Cluster mode on the fleet simulator: goodput with 1, 2, 3 and 4 berth replicas, each with its own queues
and scheduler, sharing the engines, the task clocks and (every `--interval` simulated seconds) each
other's endpoint load; calls go to the replicas in turn (a load balancer's round robin).

The setting is the scheduling benchmark's (`loadgen.bench.scheduling.policies`: the tuned configuration, 6 + 6
endpoints of the `fleet-7b` profile, 120 simulated s of arrivals) at its heaviest rates: the coding
workload's pattern1 at 10.5 tasks/s and pattern2 at 7.5 under `coding-assistant.toml`; and the
chat-batch workload (`chat-batch:mixed`, interactive and batch classes) under `chat-and-batch.toml` at
`--chat-rate`. Goodput is task-level (the share of tasks that met their SLA), the mean over `--seeds`.

    berth-loadgen bench cluster-replicas --out DIR             # about 10 minutes on one core
    berth-loadgen bench cluster-replicas --quick --out DIR     # one seed, 30 s of arrivals

The target: 3 replicas within 0.02 of one gateway's goodput. Output: DIR/report.json, DIR/report.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from gateway.config.cluster import PUBLISH_INTERVAL_S
from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.scheduling.scheduling_runs import (
    REQUEST_TIMEOUT_SIM_S,
    SIM_PORT,
    SIM_SPEED,
    SIM_URL,
    STALL_TIMEOUT_SIM_S,
    UTIL_SAMPLE_SIM_S,
)
from loadgen.bench.scheduling.scheduling_setup import _models, fleet_file, gateway_toml, policy_file
from loadgen.bench.scheduling.scheduling_types import BERTH, MODELS
from loadgen.bench.skeleton import run_bench
from loadgen.engine_sim.fleet import load_fleet_file
from loadgen.fleetsim import SimOptions, simulate

#: (workload, rate, policy) per case: the scheduling benchmark's heaviest rates, and chat-batch.
CASES: Final = (
    ("coding:pattern1", 10.5, BERTH),
    ("coding:pattern2", 7.5, BERTH),
)
ENDPOINTS: Final = 6


def one(
    workdir: Path,
    workload: str,
    rate: float,
    policy: str,
    *,
    replicas: int,
    interval: float,
    seed: int,
    duration: float,
) -> float:
    run = workdir / f"{workload.replace(':', '-')}-r{rate:g}-x{replicas}-s{seed}"
    run.mkdir(parents=True, exist_ok=True)
    fleet = run / "fleet.toml"
    fleet.write_text(fleet_file(ENDPOINTS, ENDPOINTS, SIM_SPEED))
    pol = policy_file(policy, run)
    urls = [(SIM_URL.format(i), m) for i, m in enumerate(_models(ENDPOINTS, ENDPOINTS))]
    gw = run / "gateway.toml"
    gw.write_text(gateway_toml(urls, port=SIM_PORT, policy=pol, speed=SIM_SPEED))
    report = simulate(
        SimOptions(
            policy=pol,
            fleet=tuple(load_fleet_file(fleet)),
            gateway=gw,
            workload=workload,
            rate=rate,
            duration_s=duration,
            seed=seed,
            models=MODELS,
            request_timeout_s=REQUEST_TIMEOUT_SIM_S,
            stall_timeout_s=STALL_TIMEOUT_SIM_S,
            drain_timeout_s=30.0,
            sample_every_s=UTIL_SAMPLE_SIM_S,
            replicas=replicas,
            publish_interval_s=interval,
        )
    )
    n = len(report.tasks)
    return sum(1 for t in report.tasks if t.met) / n if n else 0.0


#: The target: this many replicas within this much goodput of one gateway (fewer, when fewer ran).
TARGET_REPLICAS: Final = 3
TARGET_GOODPUT_DROP: Final = 0.02


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Goodput per case and replica count, the mean over the seeds."""
    counts = [int(x) for x in args.replicas.split(",")]
    cases = [*CASES, ("chat-batch:mixed", args.chat_rate, "chat-and-batch")]
    workdir = Path(tempfile.mkdtemp(prefix="berth-cluster-replicas-"))
    results: dict[str, dict[int, float]] = {}
    for workload, rate, policy in cases:
        key = f"{workload} @ {rate:g}/s ({policy})"
        results[key] = {}
        for n in counts:
            runs = [
                one(
                    workdir,
                    workload,
                    rate,
                    policy,
                    replicas=n,
                    interval=args.interval,
                    seed=1 + s,
                    duration=args.duration,
                )
                for s in range(args.seeds)
            ]
            results[key][n] = statistics.fmean(runs)
            print(
                f"{key}: {n} replica(s): goodput {results[key][n]:.3f} {[round(r, 3) for r in runs]}",
                file=sys.stderr,
            )
    return {"args": vars(args) | {"out": str(args.out)}, "goodput": results}


def passed(doc: dict[str, Any]) -> bool:
    """Up to `TARGET_REPLICAS` replicas, each count's goodput within the drop of one gateway's, per case."""
    return all(
        g >= by_n[1] - TARGET_GOODPUT_DROP
        for by_n in doc["goodput"].values()
        if 1 in by_n
        for n, g in by_n.items()
        if 1 < n <= TARGET_REPLICAS
    )


def table(doc: dict[str, Any]) -> str:
    counts = sorted({n for by_n in doc["goodput"].values() for n in by_n})
    lines = [
        f"| case | {' | '.join(f'{n} replica(s)' for n in counts)} |",
        "| --- |" + " --- |" * len(counts),
    ]
    for key, by_n in doc["goodput"].items():
        base = by_n.get(1)
        cells = [
            f"{g:.3f}" + ("" if base is None or n == 1 else f" ({g - base:+.3f})")
            for n, g in sorted(by_n.items())
        ]
        lines.append(f"| {key} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="berth-loadgen bench cluster-replicas", description=__doc__)
    p.add_argument("--replicas", default="1,2,3,4")
    p.add_argument(
        "--interval",
        type=float,
        default=PUBLISH_INTERVAL_S,
        help="publication interval, simulated s (default: [cluster] publish_interval_s's)",
    )
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--chat-rate", type=float, default=10.5, help="chat-batch:mixed's rate (tasks/s)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=Path("bench-out/cluster-replicas"), help="report directory")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.duration = min(args.seeds, 1), min(args.duration, 30.0)

    def run(a: argparse.Namespace) -> dict[str, Any]:
        doc = measure(a)
        print(table(doc))
        return doc

    def report(doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
        md = ["# Cluster mode on the fleet simulator: goodput per replica count", "", table(doc), ""]
        return doc, "\n".join(md)

    return run_bench(BENCHMARKS["cluster-replicas"], args, run, passed=passed, report=report)


if __name__ == "__main__":
    sys.exit(main())
