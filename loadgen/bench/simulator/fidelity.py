"""Fidelity benchmark: the offline fleet simulator (`loadgen/fleetsim`) against the live path, on the
same fleet, trace and policy, so that the simulator's figures can be trusted.

    flock /tmp/berth-heavy.lock berth-loadgen bench fidelity --out bench-fidelity   # ~12 minutes
    berth-loadgen bench fidelity --live-from bench-fidelity --out again   # simulator side only (~20 s)

Setting: CATO's, as the scheduling benchmark builds it (`loadgen.bench.scheduling.policies`): 12 `fleet-7b`
endpoints (two models, 6 each), priority scheduling, every cap at the engine's max_num_seqs, the
performance-model prior set to the profile; the `coding` workload (default pattern1) at a light and a
heavy rate (8.5 and 10.5 tasks/s), 120 simulated seconds of arrivals, seed 1; `berth` (the shipped
coding-assistant policy) and every baseline (round robin, power of two, least outstanding, each with the
coding class table added).

- live: the scheduling benchmark's own `run_one` (the engine simulator and berth as processes, loadgen
  driving them over HTTP at `--speed` 2, every SLO, task SLA and client gap scaled by 1 / speed), with
  each call recorded, so queue times (berth's x-berth-queue-ms) are known per call;
- simulated: `simulate` on the same fleet file, gateway.toml and policy file, written by the same
  functions at speed 1 with SLOs unscaled.

Units: every latency is in simulated ms (the live run's are multiplied by the speed). The trace is the
same: the live runner draws its Poisson arrivals at rate × speed over duration / speed with the same seed,
which is the simulated schedule scaled by 1 / speed.

Output: `OUT/report.md` (verdicts, per-type goodputs, what the live path adds, findings),
`OUT/report.json` (every figure), `OUT/live/...` (the live runs' files), `OUT/sim/...` (the simulator's
reports). `--notes FILE` appends a hand-written analysis to report.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.scheduling.scheduling_runs import run_one
from loadgen.bench.scheduling.scheduling_setup import fleet_file, gateway_toml, policy_file
from loadgen.bench.scheduling.scheduling_types import (
    DEFAULT_DURATION_S,
    DEFAULT_ENDPOINTS,
    DEFAULT_SEED,
    DEFAULT_SPEED,
    MODELS,
    POLICIES,
    PROFILE,
    BenchConfig,
)
from loadgen.bench.simulator.fidelity_compare import (
    CallFigures,
    Pair,
    SideFigures,
    Tolerances,
    pair,
    side_figures,
)
from loadgen.bench.simulator.fidelity_report import markdown
from loadgen.bench.skeleton import run_bench
from loadgen.engine_sim.fleet import parse_fleet
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim import SimOptions, simulate

DEFAULT_RATES: Final = (8.5, 10.5)  # pattern1: round robin ~0.94 and ~0.75 (scheduling_types)
DEFAULT_PATTERN: Final = "pattern1"
REQUEST_TIMEOUT_SIM_S: Final = 600.0  # the live run's client timeouts, in simulated seconds (run_one)
STALL_TIMEOUT_SIM_S: Final = 120.0


@dataclass(frozen=True, slots=True)
class FidelityConfig:
    out: Path
    pattern: str = DEFAULT_PATTERN
    rates: tuple[float, ...] = DEFAULT_RATES
    policies: tuple[str, ...] = tuple(POLICIES)
    speed: float = DEFAULT_SPEED  # the live side's; the simulator runs at speed 1
    duration_s: float = DEFAULT_DURATION_S  # simulated seconds of arrivals
    endpoints_per_model: int = DEFAULT_ENDPOINTS
    seed: int = DEFAULT_SEED
    drain_sim_s: float = 30.0  # simulated seconds for tasks still running after the arrivals (run_one's)
    tol: Tolerances = field(default_factory=Tolerances)
    live_from: Path | None = None  # take the live figures from this earlier output's report.json
    notes: Path | None = None

    def runs(self) -> Iterator[tuple[float, str]]:
        for rate in self.rates:
            for policy in self.policies:
                yield rate, policy


def endpoint_ids(n_a: int, n_b: int) -> list[str]:
    """berth's endpoint ids in the live run (`gateway_toml`): model letter and position."""
    models = [MODELS[0]] * n_a + [MODELS[1]] * n_b
    return [f"{m.split('-')[1]}{i:02d}" for i, m in enumerate(models)]


def sim_fleet(n_a: int, n_b: int) -> tuple[EndpointSpec, ...]:
    """The live run's fleet file at speed 1, each endpoint under its live id (placement ties go by id)."""
    specs = parse_fleet(tomllib.loads(fleet_file(n_a, n_b, 1.0)), source="fidelity fleet")
    ids = endpoint_ids(n_a, n_b)
    return tuple(dataclasses.replace(s, id=eid) for s, eid in zip(specs, ids, strict=True))


# --------------------------------------------------------------------- the live side
def live_calls(record: Path, speed: float) -> list[CallFigures]:
    """The calls of a live run's record (`--record` JSONL), latencies scaled back to simulated ms."""

    def ms(v: Any) -> float | None:
        return None if v is None else float(v) * speed

    out = []
    for line in record.read_bytes().splitlines():
        if not line.strip():
            continue
        rec = orjson.loads(line)
        obs = rec["observed"]
        out.append(
            CallFigures(
                cls=rec["class"],
                ok=bool(obs["ok"]),
                status=int(obs["status"] or 0),
                ttft_ms=ms(obs["ttft_ms"]),
                queue_ms=ms(obs["queue_ms"]),
                e2e_ms=ms(obs["e2e_ms"]),
            )
        )
    return out


async def live_side(cfg: FidelityConfig, policy: str, rate: float) -> tuple[SideFigures, dict[str, Any]]:
    """One live run (the scheduling benchmark's `run_one`, with each call recorded) and its figures."""
    n = cfg.endpoints_per_model
    out = cfg.out / "live" / f"{policy}-r{rate:g}"
    bench = BenchConfig(
        out=out,
        live=True,  # the scheduling benchmark runs on the simulator unless told otherwise
        speed=cfg.speed,
        duration_s=cfg.duration_s,
        patterns=(cfg.pattern,),
        rates={cfg.pattern: (rate,)},
        policies=(policy,),
        endpoints_per_model=n,
        seed=cfg.seed,
        aladdin=False,
        drain_sim_s=cfg.drain_sim_s,
        record=True,
    )
    result = await run_one(bench, policy, pattern=cfg.pattern, rate=rate, n_a=n, n_b=n)
    runs = sorted((out / "runs").glob("*/loadgen.json"))
    if len(runs) != 1:
        raise RuntimeError(f"expected one live run under {out / 'runs'}, found {len(runs)}")
    run_dir = runs[0].parent
    data = orjson.loads(runs[0].read_bytes())
    figures = side_figures(data, live_calls(run_dir / "record.jsonl", cfg.speed))
    return figures, {**result.to_dict(), "dir": str(run_dir)}


# --------------------------------------------------------------------- the simulated side
def sim_options(cfg: FidelityConfig, policy: str, rate: float, run_dir: Path) -> SimOptions:
    """The live run's setting for the simulator: the same fleet, gateway.toml (at speed 1, so the prior,
    intervals and limits are the unscaled ones) and policy file, SLOs unscaled."""
    n = cfg.endpoints_per_model
    run_dir.mkdir(parents=True, exist_ok=True)
    fleet = sim_fleet(n, n)
    (run_dir / "fleet.toml").write_text(fleet_file(n, n, 1.0))
    models = [m for spec in fleet for m in spec.models]
    urls = [(f"http://{eid}.sim", m) for eid, m in zip(endpoint_ids(n, n), models, strict=True)]
    policy_path = policy_file(policy, run_dir)
    gateway = run_dir / "gateway.toml"
    gateway.write_text(gateway_toml(urls, port=8080, policy=policy_path, speed=1.0))  # never bound
    return SimOptions(
        policy=policy_path,
        fleet=fleet,
        gateway=gateway,
        workload=f"coding:{cfg.pattern}",
        rate=rate,
        duration_s=cfg.duration_s,
        seed=cfg.seed,
        models=MODELS,
        request_timeout_s=REQUEST_TIMEOUT_SIM_S,
        stall_timeout_s=STALL_TIMEOUT_SIM_S,
        drain_timeout_s=cfg.drain_sim_s,
    )


def sim_side(cfg: FidelityConfig, policy: str, rate: float) -> tuple[SideFigures, dict[str, Any]]:
    run_dir = cfg.out / "sim" / f"{policy}-r{rate:g}"
    report = simulate(sim_options(cfg, policy, rate, run_dir))
    report.write(run_dir / "loadgen.json")
    calls = [
        CallFigures(
            cls=r.cls,
            ok=r.ok,
            status=r.status,
            ttft_ms=None if r.ttft_s is None else r.ttft_s * 1000.0,
            queue_ms=r.queue_ms,
            e2e_ms=None if r.e2e_s is None else r.e2e_s * 1000.0,
        )
        for r in report.requests
    ]
    return side_figures(report.data, calls), {**report.data["simulation"], "dir": str(run_dir)}


# --------------------------------------------------------------------- the benchmark
def _earlier(path: Path) -> dict[tuple[str, float], tuple[SideFigures, dict[str, Any]]]:
    doc = orjson.loads((path / "report.json").read_bytes())
    return {
        (p["policy"], float(p["rate"])): (SideFigures.from_dict(p["live"]), p["live_run"])
        for p in doc["pairs"]
    }


def setting(cfg: FidelityConfig) -> str:
    n = cfg.endpoints_per_model
    return (
        f"2 models x {n} `{PROFILE}` endpoints, priority scheduling, cap = max_num_seqs, prior = the "
        f"profile; `coding:{cfg.pattern}` at {', '.join(f'{r:g}' for r in cfg.rates)} tasks/s, "
        f"{cfg.duration_s:g} simulated s of arrivals, seed {cfg.seed}; live at speed x{cfg.speed:g}, "
        "the simulator at speed 1."
    )


async def bench(cfg: FidelityConfig, log: Any = print) -> dict[str, Any]:
    cfg.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    earlier = _earlier(cfg.live_from) if cfg.live_from is not None else {}
    pairs: list[Pair] = []
    left_out: list[str] = []
    for rate, policy in cfg.runs():
        if cfg.live_from is not None:
            if (policy, rate) not in earlier:
                log(f"{policy} at {rate:g}: no live run in {cfg.live_from}; skipped")
                continue
            live, live_run = earlier[(policy, rate)]
        else:
            live, live_run = await live_side(cfg, policy, rate)
        sim, sim_run = await asyncio.to_thread(sim_side, cfg, policy, rate)
        left_out = list(sim_run.get("left_out", left_out))
        p = pair(policy, rate, live, sim, tol=cfg.tol, live_run=live_run, sim_run=sim_run)
        pairs.append(p)
        log(
            f"{policy:18} rate={rate:g} goodput live {live.goodput} sim {sim.goodput}  p95 TTFT live "
            f"{live.ttft_p95_ms} sim {sim.ttft_p95_ms}  {'PASS' if p.passed else 'FAIL'}"
        )
    meta = {
        "setting": setting(cfg),
        "speed": cfg.speed,
        "pattern": cfg.pattern,
        "rates": list(cfg.rates),
        "policies": {p: POLICIES[p] for p in cfg.policies},
        "duration_sim_s": cfg.duration_s,
        "seed": cfg.seed,
        "tolerances": dataclasses.asdict(cfg.tol),
        "live_from": None if cfg.live_from is None else str(cfg.live_from),
        "left_out": left_out,
        "loadavg": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "elapsed_s": round(time.time() - started, 1),
    }
    doc = {"meta": meta, "pairs": [p.to_dict() for p in pairs]}
    (cfg.out / "report.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    text = markdown(pairs, meta, cfg.tol)
    if cfg.notes is not None:
        text += "\n## Analysis\n\n" + cfg.notes.read_text()
    (cfg.out / "report.md").write_text(text)
    log(text)
    return doc


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth-loadgen bench fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench-fidelity"), help="output directory")
    p.add_argument("--pattern", default=DEFAULT_PATTERN)
    p.add_argument("--rates", default=",".join(f"{r:g}" for r in DEFAULT_RATES), help="tasks/s")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"subset of {', '.join(POLICIES)}")
    p.add_argument("--speed", type=float, default=DEFAULT_SPEED, help="the live side's speed-up")
    p.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="simulated s of arrivals")
    p.add_argument("--endpoints", type=int, default=DEFAULT_ENDPOINTS, help="per model")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument(
        "--live-from",
        type=Path,
        help="run no live side: take the live figures from this earlier output (its report.json)",
    )
    p.add_argument("--notes", type=Path, help="markdown appended to report.md as its analysis")
    p.add_argument(
        "--per-type-ttft",
        action="store_true",
        help="judge each task type's P95 TTFT too (default: reported beside the verdict)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    policies = tuple(x.strip() for x in args.policies.split(",") if x.strip())
    unknown = [x for x in policies if x not in POLICIES]
    if unknown:
        print(f"unknown policies: {', '.join(unknown)}", file=sys.stderr)
        return 2
    cfg = FidelityConfig(
        out=args.out,
        pattern=args.pattern,
        rates=_floats(args.rates),
        policies=policies,
        speed=args.speed,
        duration_s=args.duration,
        endpoints_per_model=args.endpoints,
        seed=args.seed,
        tol=Tolerances(per_type_ttft=args.per_type_ttft),
        live_from=args.live_from,
        notes=args.notes,
    )

    def run(c: FidelityConfig) -> dict[str, Any]:
        import uvloop

        return uvloop.run(bench(c))

    return run_bench(
        BENCHMARKS["fidelity"],
        cfg,
        run,
        passed=lambda doc: bool(doc["pairs"]) and all(p["passed"] for p in doc["pairs"]),
    )


if __name__ == "__main__":
    sys.exit(main())
