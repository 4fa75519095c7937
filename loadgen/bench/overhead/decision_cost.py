"""The scheduler's own cost: wall time per call of berth's real `Scheduler` (the daemon makes these calls
on its event loop), with a long queue on a large fleet.

    flock /tmp/berth-heavy.lock berth-loadgen bench decisions --out bench-decisions     # a few minutes

Per shipped preset (`coding-assistant`, the three baselines, `aladdin`, `default`, `chat-and-batch`):
1. warm-up: the offline fleet simulator (`loadgen.fleetsim.Simulation`) runs the preset on 100 `fleet-7b`
   endpoints of one model (cap = max_num_seqs, priority scheduling, the profile as prior) for a while, so
   telemetry has fitted every endpoint's performance model and the output-length predictor has history:
   the SLO plugins then decide on real estimates, as in the daemon;
2. the simulation's own gateway (`SimGateway`: the scheduler, admission and telemetry built by berth's
   config code) is then driven directly on its virtual clock: requests built by the front's admission
   path (`SimGateway.admit`: SLO resolution, task clocks, token and length estimates) are submitted until
   every seat the policy will fill is taken and `--queued` requests wait (1,000 by default);
3. measured: rounds of a completion (a random running request finishes: `complete`, which serves the
   queue) and new submissions keeping the queue at its depth (`submit`), with, as in the daemon, a
   `tick` every 0.1 s (expiry, admission recheck of every queued request, serving every queue), progress
   reports of running streams (`progress`, ~2,000/s), a scrape of every endpoint every 2 s
   (`observe_gauges`) and new estimates every 1 s (`set_estimates`). A call tries to place a bounded
   number of requests (`gateway.sched.slices`); the serving it leaves to do is carried on at once, one
   slice a call, each slice timed as its own call (`serve`), as the daemon runs one slice per turn of
   its event loop. Each call is timed with
   `time.perf_counter_ns` (`--clock cpu`: the thread's CPU time, `time.thread_time_ns`, which leaves out
   the time the process waited for a core: on a machine shared with other work, the way to compare two
   versions of the code); the virtual clock moves 5 ms per round.

Workloads: the coding presets (coding-assistant and the baselines, with the coding class table as the
scheduling benchmark adds it) get `coding:pattern1`; `default` (as shipped) gets `sharegpt-like` and
`chat-and-batch` (as shipped) `chat-batch:mixed`, its interactive and batch classes. `--sla-scale K`
multiplies every task SLA (default 30, as the live standing-queue phase of `bench overhead` runs: a
request that waits its turn behind 1,000 others is still feasible). With the shipped SLAs (`--sla-scale 1`)
SLO admission refuses almost every request a full fleet is sent, and a refusal costs about a tenth of a
request let wait (85 against 940 µs at the median with `coding-assistant`): the submit figures are then
those of refusals, not of the daemon's standing queue. The report counts the measured submits the
scheduler refused.

The batch backlog case (`--backlog N`, 10,000 by default; 0 skips it) runs each preset again with only
requests of a class of kind batch in that preset kept queued: the coding presets' `translation` calls of
`coding:pattern1`, the `batch` calls of `chat-batch:mixed` for `default` and `chat-and-batch`. Preemptions
(`chat-and-batch` preempts batch work for interactive requests) take the victim out of the running set
until its next dispatch.

Garbage collection (`--gc`): by default the collector runs on the daemon's schedule
(`gateway.core.heap.GcSchedule`: settled after the fill, its young collections between the measured
calls, as the daemon runs them between the event loop's callbacks), and its pauses are reported apart
(`gc (between calls)`); `--gc cpython` leaves CPython's own thresholds on, so a collection runs inside
whichever call's allocation crossed one and counts in that call's time (with a queue of thousands a
young collection takes 0.5-2 ms there, an older one 4-7 ms: most of the p99 of `submit` and `complete`).

Target: p99 <= 1 ms for `submit`, `complete`, `tick` and `serve` with every preset; <= 2 ms in the backlog
case. A preset that misses it is run again with each judged call under a profiler of its own; the report names
where the time goes (`OUT/profile-PRESET.txt`), and `OUT/slow-calls-PRESET.txt` what the slowest tenth
of each kind of call does, against the rest.

`--columns always` (or `never`) places over columns every placement the profile can (or none),
whatever its threshold, from the warm-up on: the two paths make the same choices, so the two runs
compare their cost on the same decisions (the same queued, running and refused counts).

Output: `OUT/report.md`, `OUT/report.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.overhead.decision_driver import COLUMNS, MODEL, Driver, force_columns
from loadgen.bench.overhead.overhead_queue import QUEUE_SLA_SCALE
from loadgen.bench.overhead.slow_calls import CallProfiles, profile_sections, write_profiles
from loadgen.bench.scheduling.scheduling_setup import gateway_toml, policy_file
from loadgen.bench.skeleton import run_bench
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim import SimOptions
from loadgen.fleetsim.sim import Simulation
from loadgen.harness import REPO_ROOT

PROFILE: Final = "fleet-7b"
TARGET_P99_US: Final = 1000.0
#: The batch backlog case: this many batch requests wait, and the target per call is looser.
BACKLOG: Final = 10_000
BACKLOG_TARGET_P99_US: Final = 2000.0
JUDGED: Final = ("submit", "complete", "tick", "serve")


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    workload: str
    warmup_rate_per_endpoint: float  # tasks/s per endpoint in the warm-up (moderate load)
    # The workload whose batch requests (of a class of kind batch in the preset) make the backlog case.
    backlog_workload: str = "coding:pattern1"

    def policy(self, work: Path) -> Path:
        """The policy file to run: the presets given the coding workload as the scheduling benchmark runs
        them (with the coding class table); the others as shipped."""
        if self.workload.startswith("coding:"):
            return policy_file(self.name, work)
        return REPO_ROOT / "policies" / f"{self.name}.toml"


PRESETS: Final = {
    "coding-assistant": Preset("berth", "coding:pattern1", 0.7),
    "round-robin": Preset("round-robin", "coding:pattern1", 0.7),
    "power-of-two": Preset("power-of-two", "coding:pattern1", 0.7),
    "least-outstanding": Preset("least-outstanding", "coding:pattern1", 0.7),
    # Aladdin's best fit with the coding class table, as the scheduling benchmark runs it
    "aladdin": Preset("aladdin", "coding:pattern1", 0.7),
    "default": Preset("default", "sharegpt-like", 0.5, "chat-batch:mixed"),
    # Chiron's traffic: 70 % interactive, 30 % batch (the preset holds at most 512 interactive requests
    # in its queue; the batch ones make up the rest of the 1,000)
    "chat-and-batch": Preset("chat-and-batch", "chat-batch:mixed", 0.5, "chat-batch:mixed"),
}


@dataclass(frozen=True, slots=True)
class DecisionConfig:
    out: Path
    presets: tuple[str, ...] = tuple(PRESETS)
    endpoints: int = 100
    queued: int = 1000
    rounds: int = 3000
    warmup_s: float = 30.0  # simulated seconds of the warm-up's arrivals
    sla_scale: float = QUEUE_SLA_SCALE
    seed: int = 1
    profile: bool = True  # profile a preset that misses the target
    target_us: float = TARGET_P99_US
    # The batch backlog case per preset: `backlog` batch requests kept queued (0: not run), judged
    # against `backlog_target_us`.
    backlog: int = BACKLOG
    backlog_target_us: float = BACKLOG_TARGET_P99_US
    # "daemon": the collector on the daemon's schedule, between the calls; "cpython": its own thresholds
    gc: str = "daemon"
    clock: str = "wall"  # "wall": perf_counter; "cpu": the thread's CPU time
    columns: str = "auto"  # placement over columns: "auto" (the profile's threshold), "always", "never"


def verdicts(summary: dict[str, dict[str, float | int]], target_us: float = TARGET_P99_US) -> dict[str, bool]:
    """Per judged kind that was measured: p99 within the target."""
    return {k: float(summary[k]["p99_us"]) <= target_us for k in JUDGED if k in summary}


# --------------------------------------------------------------------- the driver
def fleet(n: int) -> tuple[EndpointSpec, ...]:
    return tuple(
        EndpointSpec(
            models=(MODEL,),
            profile=PROFILE,
            id=f"e{i:03d}",
            seed=i,
            scheduling_policy="priority",
            load_time_s=0.0,
        )
        for i in range(n)
    )


def warm_up(cfg: DecisionConfig, preset: Preset, work: Path) -> Simulation:
    """The preset on the fleet in the simulator: its gateway comes out with fitted estimates."""
    policy = preset.policy(work)
    gateway = work / f"gateway-{preset.name}.toml"
    gateway.write_text(gateway_toml([("http://e000.sim", MODEL)], port=8080, policy=policy, speed=1.0))
    opts = SimOptions(
        policy=policy,
        fleet=fleet(cfg.endpoints),
        gateway=gateway,
        workload=preset.workload,
        rate=preset.warmup_rate_per_endpoint * cfg.endpoints,
        duration_s=cfg.warmup_s,
        seed=cfg.seed,
        models=(MODEL,),
    )
    sim = Simulation(opts)
    force_columns(sim, cfg.columns)
    sim.run()
    return sim


def _driver(cfg: DecisionConfig, preset: Preset, sim: Simulation, *, backlog: bool) -> Driver:
    workload = preset.backlog_workload if backlog else preset.workload
    timer = time.thread_time_ns if cfg.clock == "cpu" else time.perf_counter_ns
    return Driver(sim, workload, sla_scale=cfg.sla_scale, seed=cfg.seed, batch_only=backlog, timer=timer)


def measure_preset(
    cfg: DecisionConfig, name: str, work: Path, log: Any = print, *, backlog: bool = False
) -> dict[str, Any]:
    """One case of a preset: `cfg.queued` requests of its workload waiting, or (`backlog`) `cfg.backlog`
    batch requests."""
    preset = PRESETS[name]
    queued = cfg.backlog if backlog else cfg.queued
    target = cfg.backlog_target_us if backlog else cfg.target_us
    t0 = time.perf_counter()
    sim = warm_up(cfg, preset, work)
    warm_s = time.perf_counter() - t0
    drv = _driver(cfg, preset, sim, backlog=backlog)
    depth0 = drv.fill(queued)
    running0 = len(drv.running)
    drv.measure(cfg.rounds, queued, gc_mode=cfg.gc)
    summary = drv.timings.summary()
    result: dict[str, Any] = {
        "preset": name,
        "case": "backlog" if backlog else "queue",
        "target_us": target,
        "policy": sim.gw.policy.name,
        "workload": f"{preset.backlog_workload} (batch classes)" if backlog else preset.workload,
        "warmup_s": round(warm_s, 1),
        "warmup_requests": len(sim.requests),
        "queued_at_start": depth0,
        "running_at_start": running0,
        "queued_at_end": drv.sched.queue_depth(MODEL),
        "running_at_end": len(drv.running),
        "refused": drv.rejected,
        "submits": drv.submits,
        "submits_refused": drv.submits_refused,
        "timings": summary,
        "verdicts": verdicts(summary, target),
    }
    result["passed"] = all(result["verdicts"].values())
    log(
        f"{name:18} {result['case']:8} queued {depth0} running {running0}: "
        + _line(summary)
        + f"  (submits refused {drv.submits_refused} of {drv.submits})"
    )
    if cfg.profile and not result["passed"]:
        result["profile"] = profile_preset(cfg, name, work, backlog=backlog)
    return result


def profile_preset(
    cfg: DecisionConfig, name: str, work: Path, top: int = 25, *, backlog: bool = False
) -> dict[str, Any]:
    """The measurement again, each judged call under a profiler of its own: the functions with the most
    time of their own and the most cumulative time over those calls (text in
    OUT/profile-NAME[-backlog].txt), and the slow calls set against the rest
    (OUT/slow-calls-NAME[-backlog].txt, `loadgen.bench.overhead.slow_calls`)."""
    preset = PRESETS[name]
    queued = cfg.backlog if backlog else cfg.queued
    drv = _driver(cfg, preset, warm_up(cfg, preset, work), backlog=backlog)
    drv.fill(queued)
    profiles = drv.profiles = CallProfiles(JUDGED)
    drv.measure(max(200, cfg.rounds // 3), queued, gc_mode=cfg.gc)
    drv.profiles = None
    return write_profiles(profiles, cfg.out, name + ("-backlog" if backlog else ""), top)


def _line(summary: dict[str, dict[str, float | int]]) -> str:
    return "  ".join(
        f"{k} p50 {v['p50_us']:.0f} µs p99 {v['p99_us']:.0f} µs (n={v['n']})"
        for k, v in summary.items()
        if k in JUDGED
    )


# --------------------------------------------------------------------- the report
def markdown(cfg: DecisionConfig, results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "# The scheduler's own cost per call",
        "",
        f"berth's `Scheduler` driven directly on {cfg.endpoints} `{PROFILE}` endpoints of one model "
        f"(cap = max_num_seqs) with {cfg.queued} requests kept queued, after a {cfg.warmup_s:g}-simulated-s "
        f"warm-up in the fleet simulator (fitted estimates); {cfg.rounds} rounds of a completion and the "
        "submissions that keep the queue full, a tick every 0.1 s, progress reports, scrapes and estimate "
        f"pushes as the daemon makes them. Task SLAs x{cfg.sla_scale:g}. Wall time per call, µs "
        f"(p50 / p99 / max); target p99 <= {cfg.target_us:.0f} µs for {', '.join(JUDGED)}. The backlog "
        f"case keeps {cfg.backlog} requests of the preset's batch classes queued instead; its target is "
        f"p99 <= {cfg.backlog_target_us:.0f} µs. Garbage collection: "
        + (
            "on the daemon's schedule, between the calls (its pauses apart)."
            if cfg.gc == "daemon"
            else "CPython's own thresholds (a collection counts in the call it interrupts)."
        )
        + (" Timed by the thread's CPU time." if cfg.clock == "cpu" else "")
        + ("" if cfg.columns == "auto" else f" Placement over columns: {cfg.columns}."),
        "",
    ]
    header = ["preset", "case", "workload", "queued / running", *JUDGED, "progress", "verdict"]
    rows = []
    for r in results:
        t = r["timings"]

        def cell(kind: str, t: dict[str, Any] = t) -> str:
            v = t.get(kind)
            return "-" if v is None else f"{v['p50_us']:.0f} / {v['p99_us']:.0f} / {v['max_us']:.0f}"

        bad = [k for k, ok in r["verdicts"].items() if not ok]
        rows.append(
            [
                r["preset"],
                r["case"],
                r["workload"],
                f"{r['queued_at_start']} / {r['running_at_start']}",
                *(cell(k) for k in JUDGED),
                cell("progress"),
                "PASS" if r["passed"] else f"FAIL ({', '.join(bad)})",
            ]
        )
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", "Other calls (p50 / p99 µs): "]
    for r in results:
        t = r["timings"]
        other = [
            f"{k} {v['p50_us']:.0f} / {v['p99_us']:.0f}"
            for k, v in t.items()
            if k not in (*JUDGED, "progress")
        ]
        lines.append(
            f"- {r['preset']} ({r['case']}): {'; '.join(other) or '-'}; refused {r['refused']} "
            f"(of the measured submits: {r['submits_refused']} of {r['submits']})"
        )
    lines += profile_sections(results, JUDGED)
    lines.append("")
    return "\n".join(lines)


def bench(cfg: DecisionConfig, log: Any = print) -> dict[str, Any]:
    cfg.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = []
    with tempfile.TemporaryDirectory(prefix="berth-decisions-") as tmp:
        for name in cfg.presets:
            if cfg.queued > 0:
                results.append(measure_preset(cfg, name, Path(tmp), log))
            if cfg.backlog > 0:
                results.append(measure_preset(cfg, name, Path(tmp), log, backlog=True))
    doc = {
        "config": {**dataclasses.asdict(cfg), "out": str(cfg.out)},
        "results": results,
        "elapsed_s": round(time.time() - started, 1),
    }
    (cfg.out / "report.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    text = markdown(cfg, results)
    (cfg.out / "report.md").write_text(text)
    log(text)
    return doc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth-loadgen bench decisions", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench-decisions"), help="output directory")
    p.add_argument("--presets", default=",".join(PRESETS), help=f"subset of {', '.join(PRESETS)}")
    p.add_argument("--endpoints", type=int, default=100)
    p.add_argument("--queued", type=int, default=1000, help="requests kept waiting (0: skip this case)")
    p.add_argument("--rounds", type=int, default=3000, help="completions measured per preset")
    p.add_argument("--warmup", type=float, default=30.0, help="simulated s of the warm-up's arrivals")
    p.add_argument(
        "--sla-scale",
        type=float,
        default=QUEUE_SLA_SCALE,
        help=f"multiply every task SLA (default {QUEUE_SLA_SCALE:g}, as the live standing-queue phase)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-profile", action="store_true", help="do not profile a preset that misses the target")
    p.add_argument("--target-us", type=float, default=TARGET_P99_US, help="p99 target per call (µs)")
    p.add_argument("--backlog", type=int, default=BACKLOG, help="backlog case size (0: skip)")
    p.add_argument("--backlog-target-us", type=float, default=BACKLOG_TARGET_P99_US, help="its p99 target")
    p.add_argument(
        "--gc",
        choices=("daemon", "cpython"),
        default="daemon",
        help="the collector on the daemon's schedule, between calls (default), or CPython's thresholds",
    )
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time calls by the wall clock (default) or the thread's CPU time (a shared machine)",
    )
    p.add_argument(
        "--columns",
        choices=tuple(COLUMNS),
        default="auto",
        help="place over columns by the profile's threshold (default), for every placement, or never",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    presets = tuple(x.strip() for x in args.presets.split(",") if x.strip())
    unknown = [x for x in presets if x not in PRESETS]
    if unknown:
        print(f"unknown presets: {', '.join(unknown)}", file=sys.stderr)
        return 2
    cfg = DecisionConfig(
        out=args.out,
        presets=presets,
        endpoints=args.endpoints,
        queued=args.queued,
        rounds=args.rounds,
        warmup_s=args.warmup,
        sla_scale=args.sla_scale,
        seed=args.seed,
        profile=not args.no_profile,
        target_us=args.target_us,
        backlog=args.backlog,
        backlog_target_us=args.backlog_target_us,
        gc=args.gc,
        clock=args.clock,
        columns=args.columns,
    )
    return run_bench(
        BENCHMARKS["decisions"], cfg, bench, passed=lambda doc: all(r["passed"] for r in doc["results"])
    )


if __name__ == "__main__":
    sys.exit(main())
