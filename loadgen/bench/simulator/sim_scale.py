"""Scale and speed of the offline fleet simulator (`loadgen/fleetsim`): a benchmark, not a test.

    flock /tmp/berth-heavy.lock berth-loadgen bench simscale --out bench-simscale     # a few minutes

Fleet: one model (`chat-7b`) on `fleet-7b` endpoints, berth's cap at the engine's max_num_seqs, priority
scheduling off; gateway settings as the scheduling benchmark writes them at speed 1 (prior = the profile);
the `sharegpt-like` workload (one chat call per task: requests = tasks) under the packaged `default`
policy (FCFS, least outstanding), Poisson arrivals at a fixed rate per endpoint (default 0.5 requests/s,
about 60 % of what a `fleet-7b` endpoint serves with ShareGPT's lengths).

Points, each in a process of its own pinned to one core (`taskset`, default CPU 0), so that its wall time
is one core's and its peak RSS (`resource.getrusage`, ru_maxrss) is its own:
(a) headline: 100,000 requests over 100 endpoints (target: wall <= 60 s);
(b) curve: 10, 100 and 1,000 endpoints at the same load per endpoint for a fixed simulated duration, so
    requests and events grow with the fleet: wall time per event should stay flat (near-linear);
(c) memory: each point's peak RSS, and its RSS after the imports (the interpreter and berth's modules),
    so the growth per request is visible.

Targets, each with a verdict line at the end of the report: (a) within 60 s of wall time; (b) wall time
against simulated requests near-linear, log-log slope at most 1.05; (c) peak memory stated. `--policy
policies/coding-assistant.toml` runs the SLO preset (the targets hold for it too); `--shares` splits each
point's wall time into berth's scheduler, its telemetry, its admission and the simulator itself
(`sim_share`); `--max-run 1` runs the simulator token by token (every decode iteration its own event: the
same reports, slower), for a side-by-side. Each point runs under the daemon's collector schedule
(`SimOptions.collector`; `--collector cpython`: CPython's own thresholds) and reports its collections.

Output: `OUT/report.md`, `OUT/report.json`.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.simulator.sim_scale_report import (
    HEADLINE_REQUESTS,
    PROFILE,
    curve_summary,
    markdown,
    memory_model,
    verdicts,
)
from loadgen.bench.skeleton import run_bench
from loadgen.fleetsim.runs import MAX_RUN
from loadgen.harness import REPO_ROOT, pinned

MODEL: Final = "chat-7b"
WORKLOAD: Final = "sharegpt-like"
POLICY: Final = REPO_ROOT / "policies" / "default.toml"
DEFAULT_RATE_PER_ENDPOINT: Final = 0.5
HEADLINE_ENDPOINTS: Final = 100
CURVE_SIZES: Final = (10, 100, 1000)
CURVE_DURATION_S: Final = 60.0  # keeps the 1,000-endpoint point (~30,000 requests) within a few minutes


@dataclass(frozen=True, slots=True)
class Point:
    """One simulation to measure."""

    label: str
    endpoints: int
    rate: float  # requests (tasks) per second, whole fleet
    duration_s: float  # simulated seconds of arrivals
    seed: int = 1
    policy: Path = POLICY
    workload: str = WORKLOAD
    max_run: int = MAX_RUN  # the simulator's decode run length (1: token by token)
    shares: bool = False  # time berth's parts (`sim_share`)
    collector: str = "daemon"  # `SimOptions.collector`

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "loadgen.bench.simulator.sim_scale",
            "--point",
            str(self.endpoints),
            f"{self.rate!r}",
            f"{self.duration_s!r}",
            str(self.seed),
            str(self.policy.resolve()),
            self.workload,
            str(self.max_run),
            "1" if self.shares else "0",
            self.collector,
        ]


# --------------------------------------------------------------------- one point, in its own process
def _rss_kib() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


def measure(point: Point, work: Path, profile_to: Path | None = None) -> dict[str, Any]:
    """Run one simulation in this process; its figures (meant for a fresh process: RSS is the peak of
    this process's life). With `profile_to`, under cProfile, whose top functions go to that file."""
    from loadgen.bench.scheduling.scheduling_setup import gateway_toml
    from loadgen.bench.simulator.sim_share import instrument, split
    from loadgen.engine_sim.spec import EndpointSpec
    from loadgen.fleetsim import SimOptions
    from loadgen.fleetsim.collector import GcTally
    from loadgen.fleetsim.sim import Simulation

    rss_base = _rss_kib()
    endpoints, policy, workload = point.endpoints, point.policy, point.workload
    fleet = tuple(
        EndpointSpec(models=(MODEL,), profile=PROFILE, id=f"e{i:04d}", seed=i, cap=None, load_time_s=0.0)
        for i in range(endpoints)
    )
    work.mkdir(parents=True, exist_ok=True)
    gateway = work / f"gateway-{os.getpid()}.toml"
    # The scheduling benchmark's settings at speed 1 (its [[endpoints]] are not read by the simulator).
    gateway.write_text(gateway_toml([("http://e0000.sim", MODEL)], port=8080, policy=policy, speed=1.0))
    opts = SimOptions(
        policy=policy,
        fleet=fleet,
        gateway=gateway,
        workload=workload,
        rate=point.rate,
        duration_s=point.duration_s,
        seed=point.seed,
        models=(MODEL,),
        max_run=point.max_run,
        collector="daemon" if point.collector == "daemon" else "cpython",
    )
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    prof = cProfile.Profile() if profile_to is not None else None
    if prof is not None:
        prof.enable()
    random.seed(opts.seed)  # as `simulate` does
    sim = Simulation(opts)
    shares = instrument(sim) if point.shares else None
    with GcTally() as tally:
        report = sim.run()
    if prof is not None:
        prof.disable()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    if prof is not None and profile_to is not None:
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(30)
        profile_to.write_text(buf.getvalue())
    gateway.unlink(missing_ok=True)
    sim_doc = report.data["simulation"]
    overall = report.data["overall"]
    return {
        "endpoints": endpoints,
        "rate": point.rate,
        "duration_sim_s": point.duration_s,
        "requests": overall["count"],
        "ok": overall["ok"],
        "goodput": overall["goodput"],
        "utilization": report.data["fleet"]["utilization"],
        "events": sim_doc["events"],
        "wall_s": round(wall, 3),  # simulate() whole: the run and building its report
        "loop_wall_s": sim_doc["wall_s"],  # the simulator's own figure
        "cpu_s": round(cpu, 3),
        "requests_per_s": round(overall["count"] / wall, 1) if wall > 0 else None,
        "events_per_s": round(sim_doc["events"] / wall, 1) if wall > 0 else None,
        "rss_base_mib": round(rss_base / 1024, 1),
        "rss_peak_mib": round(_rss_kib() / 1024, 1),
        "policy": sim_doc["policy"],
        "workload": workload,
        "max_run": point.max_run,
        "profiled": profile_to is not None,
        "shares_s": None if shares is None else split(shares, wall),
        "collector": point.collector,
        "gc": tally.document(),  # collections per generation and their wall seconds, during the run
    }


def run_point(
    point: Point, cpus: Sequence[int] | None, work: Path, profile_to: Path | None = None
) -> dict[str, Any]:
    """`point` in a fresh process (pinned to `cpus`); its figures."""
    extra = ["--work", str(work)] + ([] if profile_to is None else ["--profile-to", str(profile_to)])
    argv = pinned([*point.argv(), *extra], None if cpus is None else set(cpus))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(argv, capture_output=True, check=False, cwd=REPO_ROOT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(
            f"simscale point {point.label} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}"
        )
    figures: dict[str, Any] = orjson.loads(proc.stdout.splitlines()[-1])
    return {"label": point.label, **figures}


# --------------------------------------------------------------------- the benchmark
@dataclass(frozen=True, slots=True)
class ScaleConfig:
    out: Path
    rate_per_endpoint: float = DEFAULT_RATE_PER_ENDPOINT
    headline_endpoints: int = HEADLINE_ENDPOINTS
    headline_requests: int = HEADLINE_REQUESTS
    sizes: tuple[int, ...] = CURVE_SIZES
    curve_duration_s: float = CURVE_DURATION_S
    cpus: tuple[int, ...] | None = (0,)
    profile: bool = False  # each point under cProfile (OUT/profile-LABEL.txt); its wall times inflate
    seed: int = 1
    policy: Path = POLICY
    workload: str = WORKLOAD
    max_run: int = MAX_RUN
    shares: bool = False
    collector: str = "daemon"

    def headline(self) -> Point:
        rate = self.headline_endpoints * self.rate_per_endpoint
        return Point(
            "headline",
            self.headline_endpoints,
            rate,
            self.headline_requests / rate,
            self.seed,
            self.policy,
            self.workload,
            self.max_run,
            self.shares,
            self.collector,
        )

    def curve(self) -> list[Point]:
        return [
            Point(
                f"curve-{n}",
                n,
                n * self.rate_per_endpoint,
                self.curve_duration_s,
                self.seed,
                self.policy,
                self.workload,
                self.max_run,
                self.shares,
                self.collector,
            )
            for n in self.sizes
        ]


def _profile_path(cfg: ScaleConfig, p: Point) -> Path | None:
    return (cfg.out / f"profile-{p.label}.txt").resolve() if cfg.profile else None


def bench(cfg: ScaleConfig, *, headline: bool = True, log: Any = print) -> dict[str, Any]:
    cfg.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    work = cfg.out / "work"
    head = None
    if headline:
        p = cfg.headline()
        log(f"(a) {p.endpoints} endpoints, {p.rate:g} req/s for {p.duration_s:g} simulated s ...")
        head = run_point(p, cfg.cpus, work, _profile_path(cfg, p))
        log(f"    {head}")
    curve = []
    for p in cfg.curve():
        log(f"(b) {p.endpoints} endpoints, {p.rate:g} req/s for {p.duration_s:g} simulated s ...")
        curve.append(run_point(p, cfg.cpus, work, _profile_path(cfg, p)))
        log(f"    {curve[-1]}")
    doc = {
        "config": {
            "rate_per_endpoint": cfg.rate_per_endpoint,
            "headline": {"endpoints": cfg.headline_endpoints, "requests": cfg.headline_requests},
            "sizes": list(cfg.sizes),
            "curve_duration_sim_s": cfg.curve_duration_s,
            "cpus": None if cfg.cpus is None else list(cfg.cpus),
            "policy": str(cfg.policy),
            "workload": cfg.workload,
            "max_run": cfg.max_run,
            "shares": cfg.shares,
            "collector": cfg.collector,
            "profile": PROFILE,
            "seed": cfg.seed,
            "loadavg": list(os.getloadavg()),
            "cpus_total": os.cpu_count(),
        },
        "headline": head,
        "curve": curve,
        "curve_summary": curve_summary(curve) if curve else None,
        "memory_model": memory_model(([head] if head is not None else []) + curve),
        "verdicts": verdicts(head, curve),
        "elapsed_s": round(time.time() - started, 1),
    }
    (cfg.out / "report.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    text = markdown(cfg, head, curve)
    (cfg.out / "report.md").write_text(text)
    log(text)
    return doc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth-loadgen bench simscale", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench-simscale"), help="output directory")
    p.add_argument("--rate-per-endpoint", type=float, default=DEFAULT_RATE_PER_ENDPOINT)
    p.add_argument("--headline-endpoints", type=int, default=HEADLINE_ENDPOINTS)
    p.add_argument("--headline-requests", type=int, default=HEADLINE_REQUESTS)
    p.add_argument("--no-headline", action="store_true", help="the curve only")
    p.add_argument(
        "--sizes", default=",".join(map(str, CURVE_SIZES)), help="endpoints per curve point, comma-separated"
    )
    p.add_argument("--curve-duration", type=float, default=CURVE_DURATION_S, help="simulated s per point")
    p.add_argument("--cpu", default="0", help="CPU list each point is pinned to ('' : not pinned)")
    p.add_argument("--policy", type=Path, default=POLICY)
    p.add_argument("--workload", default=WORKLOAD)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--max-run",
        type=int,
        default=MAX_RUN,
        help="decode iterations the simulator plans as one event (1: token by token, the slow path)",
    )
    p.add_argument(
        "--shares",
        action="store_true",
        help="time the calls into berth's scheduler, telemetry and admission (section (d))",
    )
    # One point in this process (what `run_point` starts):
    p.add_argument(
        "--collector",
        choices=("daemon", "cpython"),
        default="daemon",
        help="the cyclic garbage collector during each point: the daemon's schedule (GcSchedule) or "
        "CPython's own thresholds",
    )
    # ENDPOINTS RATE DURATION SEED POLICY WORKLOAD MAX_RUN SHARES COLLECTOR.
    p.add_argument("--point", nargs=9, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--profile-to", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--profile", action="store_true", help="run each point under cProfile (OUT/profile-LABEL.txt)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.point:
        n, rate, duration, seed, policy, workload, max_run, shares, collector = args.point
        work = args.work or Path(".")
        point = Point(
            "point",
            int(n),
            float(rate),
            float(duration),
            int(seed),
            Path(policy),
            workload,
            int(max_run),
            shares == "1",
            collector,
        )
        fig = measure(point, work, args.profile_to)
        sys.stdout.write(orjson.dumps(fig).decode() + "\n")
        return 0
    cpus = tuple(int(c) for c in args.cpu.split(",") if c.strip()) or None
    cfg = ScaleConfig(
        out=args.out,
        rate_per_endpoint=args.rate_per_endpoint,
        headline_endpoints=args.headline_endpoints,
        headline_requests=args.headline_requests,
        sizes=tuple(int(x) for x in args.sizes.split(",") if x.strip()),
        curve_duration_s=args.curve_duration,
        cpus=cpus,
        profile=args.profile,
        seed=args.seed,
        policy=args.policy,
        workload=args.workload,
        max_run=args.max_run,
        shares=args.shares,
        collector=args.collector,
    )
    return run_bench(
        BENCHMARKS["simscale"],
        cfg,
        lambda c: bench(c, headline=not args.no_headline),
        passed=lambda doc: bool(doc["verdicts"]) and not any("NOT MET" in v for v in doc["verdicts"]),
    )


if __name__ == "__main__":
    sys.exit(main())
