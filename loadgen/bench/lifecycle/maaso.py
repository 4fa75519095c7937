"""MaaSO's setting (papers/ALGORITHMS.md §4) on the offline fleet simulator: heterogeneous instance
configurations placed by the SLO mix, with sub-cluster distribution, against homogeneous replication on
the same devices.

    berth-loadgen bench maaso --out DIR             # 3 burstiness levels x 3 seeds (~10 min)
    berth-loadgen bench maaso --quick --out DIR     # one burstiness level, one seed, a short run

Setup:
- one model on 24 devices of the simulator's `a100-llama2-7b` profile at a quarter of its speed (the
  same shape, four times fewer events to simulate; every time below scales with it). Candidate
  instance configurations: one device with max batch 8, 16 or 32, and two devices (tensor parallel:
  modelled as 1.7x the decode and prefill speed and twice the KV cache) with max batch 8 or 16;
- the `maaso` workload: prompts of 100-400 tokens, decode lengths 300-1000, deadlines of factor 0.8-1.5
  times decode length x t_slot (MaaSO's time slot: a decode iteration of a plain one-device instance
  with its full batch of 32), gamma arrivals at `rate` requests/s with coefficient of variation 1, 2
  and 4 (rising burstiness), for 480 s (deadlines are about a minute: a shorter run ends before a
  queue that outgrows the fleet shows);
- **profiler**: each configuration's per-request decode rate at concurrency 1..B (the decode iteration
  of the profile at the mean context, the prefills of the requests replacing finished ones included)
  fitted by telemetry's `PerfModelFitter` to ``thr(n) = thr1 − α·ln(1 + β·min(n, B))``;
- **heterogeneous**: `gateway.sched.heterogeneous.Placer` on that mix and those curves chooses the
  instances for the 24 devices and their split between the strict (factor < 1.1, max batch <= 16) and
  the relaxed sub-cluster; berth runs the `sub-cluster` filter, the overflow guard and least
  outstanding (EDF ordering);
- **homogeneous**: the same 24 devices as instances of one configuration, the same policy (the
  sub-cluster filter does not split a fleet whose endpoints are all alike): tp1-b32 (plain replication
  at the batch an operator would pick for throughput), tp1-b16 and tp2-b16.
- **scaler + next_config**: the fleet grown by the autoscale loop instead of placed in advance: the
  lifecycle on 3 nodes of 8 devices starts from 4 ready instances of the default configuration
  (tp1-b32), `queue-length` (one instance per 8 requests running or queued, no delay, never retiring)
  adds instances every 5 s round (10 s loads) up to 24, and the loop chooses each new instance's
  configuration by MaaSO's placer on the SLO mix it saw (`gateway.lifecycle.config_choice`; the
  candidates' profiled curves as the priors until telemetry fits them); **scaler + default config**:
  the same with one configuration (tp1-b32), the loop's choice out of play.

Every request is judged by the client: met when it finished within its deadline (unfinished and
refused requests missed). Figures per configuration and burstiness: SLO attainment (all, tight,
relaxed), mean and p95 latency, output tokens/s; means over seeds with 95 % Student t intervals.

Target (MaaSO: +15-30 %): at every burstiness the heterogeneous placement's attainment is >= 1.15x that
of plain replication. The best homogeneous configuration is reported beside it.

Output: DIR/report.md and DIR/report.json (`setting(seeds, quick)`'s dict); runs under DIR/runs/.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from gateway.sched.heterogeneous import Placement
from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import config_or_reason, say
from loadgen.bench.lifecycle.maaso_report import _rows, _targets, markdown
from loadgen.bench.lifecycle.maaso_setup import (
    CANDIDATES,
    CONFIGS,
    DEVICES,
    MODEL,
    PLAIN,
    PROFILE,
    QUICK,
    QUICK_CVS,
    QUICK_DURATION_S,
    SCALED,
    SCALER_ROWS,
    SPEED,
    TP2_SPEEDUP,
    Config,
    Run,
    autoscale_text,
    fleet,
    gateway_toml,
    instances_for,
    lifecycle,
    placer,
    policy_text,
    profile,
    t_slot_s,
    traffic_mix,
)
from loadgen.bench.skeleton import run_bench
from loadgen.fleetsim import SimOptions, simulate


def run_one(cfg: Config, config: str, cv: float, seed: int, placement: Placement) -> Run:
    t0 = time.perf_counter()
    d = cfg.out / "runs" / f"{config}-cv{cv:g}-s{seed}"
    d.mkdir(parents=True, exist_ok=True)
    scaled = config in SCALER_ROWS
    (d / "policy.toml").write_text(policy_text() + (autoscale_text() if scaled else ""))
    (d / "gateway.toml").write_text(gateway_toml())
    # The scaled rows' fleet is the lifecycle's templates: one endpoint per configuration it may start.
    templates = [c.name for c in CANDIDATES] if config == SCALED else [PLAIN.removeprefix("homogeneous-")]
    instances = templates if scaled else instances_for(config, placement)
    opts = SimOptions(
        policy=d / "policy.toml",
        fleet=fleet(instances),
        lifecycle=lifecycle(config) if scaled else None,
        gateway=d / "gateway.toml",
        workload=f"maaso:{t_slot_s() * 1000.0:.6g}",
        rate=cfg.rate,
        duration_s=cfg.duration_s,
        arrival="gamma",
        cv=cv,
        seed=seed,
        models=(MODEL,),
        slo_headers=True,
        request_timeout_s=600.0,
        stall_timeout_s=600.0,
        drain_timeout_s=600.0,
    )
    report = simulate(opts).data
    figures = summarize(report)
    if scaled:  # what the loop started (the initial instances included)
        started = report["lifecycle"]["started_by_config"]
        plain = PLAIN.removeprefix("homogeneous-")
        instances = [plain if name == "default" else name for name, n in started.items() for _ in range(n)]
    (d / "figures.json").write_bytes(
        orjson.dumps({"instances": instances, **figures}, option=orjson.OPT_INDENT_2)
    )
    return Run(config, cv, seed, instances, figures, time.perf_counter() - t0)


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    overall = report["overall"]
    classes = report["classes"]

    def att(name: str) -> float | None:
        c = classes.get(name)
        return None if c is None or c["goodput"] is None else float(c["goodput"])

    return {
        "requests": overall["count"],
        "attainment": float(overall["goodput"] or 0.0),
        "attainment_tight": att("tight"),
        "attainment_relaxed": att("relaxed"),
        "e2e_p50_ms": overall["e2e_p50_ms"],
        "e2e_p95_ms": overall["e2e_p95_ms"],
        "output_tokens_per_s": overall["output_tokens_per_s"],
        "errors": overall["errors"],
    }


# --------------------------------------------------------------------- the setting
def setting(
    seeds: Sequence[int],
    quick: bool,
    *,
    out: Path | None = None,
    log: Callable[[str], None] = say,
    duration_s: float | None = None,
) -> dict[str, Any]:
    """MaaSO's setting as one part of a larger report (`bench autoscaling`): `{"setting": "maaso",
    "rows", "targets": [{"name", "measured", "target", "passed"}], "markdown", ...}`, JSON-able. `quick`:
    one burstiness level and the first seed, a short run. `out`: where the runs' files go (default: a
    temporary directory); `duration_s` overrides the seconds of arrivals."""
    cfg = Config(
        out=out or Path(tempfile.mkdtemp(prefix="berth-maaso-")), seeds=tuple(seeds) or (0,), quick=quick
    )
    if quick:
        cfg = replace(cfg, cvs=QUICK_CVS, duration_s=QUICK_DURATION_S, seeds=cfg.seeds[:1])
    if duration_s is not None:
        cfg = replace(cfg, duration_s=duration_s)
    return _setting(cfg, log)


def _setting(cfg: Config, log: Callable[[str], None]) -> dict[str, Any]:
    p = placer()
    runs: list[Run] = []
    placements: dict[float, Placement] = {}
    for cv in cfg.cvs:
        placement = placements[cv] = p.place(traffic_mix(cfg.rate, cv), DEVICES)
        log(
            f"cv {cv:g}: placement strict {list(placement.instances['strict'])} "
            f"relaxed {list(placement.instances['relaxed'])} (score {placement.score:.3f})"
        )
        for seed in cfg.seeds:
            for config in cfg.configs:
                r = run_one(cfg, config, cv, seed, placement)
                runs.append(r)
                f = r.figures
                log(
                    f"{config:22s} cv {cv:g} seed {seed}: attainment {f['attainment']:.3f} "
                    f"(tight {f['attainment_tight']}, relaxed {f['attainment_relaxed']}), "
                    f"p95 {f['e2e_p95_ms']} ms ({r.wall_s:.0f} s)"
                )
    rows = _rows(cfg, runs, placements)
    targets = _targets(cfg, rows)
    result: dict[str, Any] = {
        "setting": "maaso",
        "setup": {
            "profile": PROFILE,
            "speed": SPEED,
            "tp2_speedup": TP2_SPEEDUP,
            "devices": DEVICES,
            "rate": cfg.rate,
            "duration_s": cfg.duration_s,
            "cvs": list(cfg.cvs),
            "seeds": list(cfg.seeds),
            "t_slot_ms": round(t_slot_s() * 1000.0, 3),
            "candidates": [
                {"name": c.name, "devices": c.devices, "max_batch": c.max_batch} for c in CANDIDATES
            ],
            "curves": {
                c.name: {k: round(getattr(profile(c), k), 4) for k in ("thr1", "alpha", "beta")}
                for c in CANDIDATES
            },
            "quick": cfg.quick,
        },
        "placements": {
            f"{cv:g}": {
                "instances": {s: list(v) for s, v in pl.instances.items()},
                "devices": dict(pl.devices),
                "score": round(pl.score, 4),
            }
            for cv, pl in placements.items()
        },
        "rows": rows,
        "targets": targets,
        "runs": [
            {"config": r.config, "cv": r.cv, "seed": r.seed, "wall_s": round(r.wall_s, 1), **r.figures}
            for r in runs
        ],
    }
    result["markdown"] = markdown(result)
    return result


# --------------------------------------------------------------------- command line
def bench(cfg: Config, log: Callable[[str], None] = say) -> dict[str, Any]:
    cfg.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result = _setting(cfg, log)
    result["setup"]["elapsed_s"] = round(time.perf_counter() - started, 1)
    (cfg.out / "report.md").write_text(result["markdown"])
    (cfg.out / "report.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    log(result["markdown"])
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="berth-loadgen bench maaso", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--out", type=Path, required=True, help="report directory")
    p.add_argument("--quick", action="store_true", help="one burstiness level, one seed, a short run")
    p.add_argument("--seeds", type=int, help="seeds 0..N-1")
    p.add_argument("--cvs", help="coefficients of variation of the arrival gaps, comma-separated")
    p.add_argument("--rate", type=float, help="requests/s")
    p.add_argument("--duration", type=float, help="seconds of arrivals")
    p.add_argument("--configs", help=f"rows to run, comma-separated (default all: {', '.join(CONFIGS)})")
    return p


def config_from_args(a: argparse.Namespace) -> Config:
    base: dict[str, Any] = dict(QUICK) if a.quick else {}
    if a.seeds is not None:
        base["seeds"] = tuple(range(a.seeds))
    if a.cvs:
        base["cvs"] = tuple(float(x) for x in a.cvs.split(","))
    if a.rate is not None:
        base["rate"] = a.rate
    if a.duration is not None:
        base["duration_s"] = a.duration
    if a.configs:
        rows = tuple(c for c in a.configs.split(",") if c)
        unknown = [c for c in rows if c not in CONFIGS]
        if unknown:
            raise ValueError(f"unknown row(s) {', '.join(unknown)} (known: {', '.join(CONFIGS)})")
        base["configs"] = tuple(c for c in CONFIGS if c in rows or c == PLAIN)
    cfg = Config(out=a.out, quick=a.quick, **base)
    if not cfg.seeds or not cfg.cvs or cfg.rate <= 0 or cfg.duration_s <= 0 or min(cfg.cvs) <= 0:
        raise ValueError("need seeds >= 1, cvs > 0, rate > 0 and duration > 0")
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_or_reason(lambda: config_from_args(args))
    return run_bench(
        BENCHMARKS["maaso"],
        cfg,
        lambda c: bench(c, log=say),
        passed=lambda r: all(t["passed"] for t in r["targets"] if t["judged"]),
    )


if __name__ == "__main__":
    sys.exit(main())
