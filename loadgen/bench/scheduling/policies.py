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
and the live path build it from the same functions (`fleet_file`, `gateway_toml`, `policy_file`):
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
import asyncio
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.scheduling.live_stack import berth_metrics, counter_total, cpu_validity, live_processes
from loadgen.bench.scheduling.scheduling_report import markdown, plot, ratio_fleet, verdict
from loadgen.bench.scheduling.scheduling_types import (
    BERTH,
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
    GOODPUT_TARGET,
    LIVE_SEEDS,
    MODELS,
    POLICIES,
    PRESETS,
    PROFILE,
    QUICK_SEEDS,
    TASK_TYPES,
    TUNED,
    VARIANTS,
    BenchConfig,
    RunResult,
    policy_source,
    preset_file,
    split,
)
from loadgen.bench.skeleton import run_bench
from loadgen.client import RequestResult
from loadgen.engine_sim.fleet import load_fleet_file
from loadgen.engine_sim.profiles import get_profile
from loadgen.fleetsim import SimOptions, simulate
from loadgen.harness import REPO_ROOT
from loadgen.runner import RunOptions, build_schedule, run_workload
from loadgen.workloads import get_workload
from loadgen.workloads.trace import trace_line

POLICY_DIR: Final = REPO_ROOT / "policies"
UTIL_SAMPLE_SIM_S: Final = 2.0  # CATO samples utilization every 2 s
REQUEST_TIMEOUT_SIM_S: Final = 600.0  # the client gives up on a request after this long (simulated s)
STALL_TIMEOUT_SIM_S: Final = 120.0  # ... or after this long without a byte
#: The offline simulator runs in virtual time: no speed-up, so nothing is scaled.
SIM_SPEED: Final = 1.0
#: berth's listen address in a simulated run's gateway.toml (the simulator opens no socket) and its
#: endpoints' URLs there (the simulator reads only [limits], [scrape], [telemetry] and [aliases]).
SIM_PORT: Final = 8080
SIM_URL: Final = "http://e{:03d}.sim"


# --------------------------------------------------------------------- files
def fleet_file(n_a: int, n_b: int, speed: float, *, config: str = TUNED) -> str:
    """The fleet: `n_a` endpoints of model a, `n_b` of model b; priority scheduling when tuned, the
    engines' default (FCFS) on day one."""
    lines = [
        "[defaults]",
        f'profile = "{PROFILE}"',
        f"speed = {speed}",
        f'scheduling_policy = "{"priority" if config == TUNED else "fcfs"}"',
        "load_time_s = 0.0",
        "",
    ]
    for model, n in zip(MODELS, (n_a, n_b), strict=True):
        if n:
            lines += ["[[endpoints]]", f'models = ["{model}"]', f"count = {n}", ""]
    return "\n".join(lines)


def gateway_toml(
    urls: Sequence[tuple[str, str]], *, port: int, policy: Path, speed: float, config: str = TUNED
) -> str:
    """berth's configuration for a run. Tuned: every endpoint at its engine's seats, priority
    scheduling, the fleet profile as the performance-model prior (times divided by the speed). Day one:
    the endpoints' URLs and the policy, every other setting at its default."""
    out = [
        "[server]",
        f'listen = "127.0.0.1:{port}"',
        'log_level = "warning"',
        "drain_timeout_s = 2.0",
    ]
    if config == TUNED:
        prof = get_profile(PROFILE)
        lat = prof.latency
        s = speed
        out += [
            "[limits]",
            "max_queue_per_model = 8192",
            f"max_queue_wait_s = {600.0 / s:.3f}",
            f"default_endpoint_cap = {prof.max_num_seqs}",
            "[scrape]",
            f"interval_s = {max(0.2, 2.0 / s):.3f}",
            f"stale_after_s = {max(1.0, 10.0 / s):.3f}",
            "[telemetry]",
            f"refresh_interval_s = {max(0.2, 1.0 / s):.3f}",
            f"kv_capacity_tokens = {prof.kv_capacity_tokens}",
            *lat.scaled(s).prior_toml(),
            "h = 1.0",
            "j = 1.0",
        ]
    out += ["[policy]", f"file = {orjson.dumps(str(policy)).decode()}", ""]
    for i, (url, model) in enumerate(urls):
        out += ["[[endpoints]]", f'url = "{url}"']
        if config == TUNED:
            out += [
                f'id = "{model.split("-")[1]}{i:02d}"',
                'engine = "vllm"',
                f'models = ["{model}"]',
                'scheduling = "priority"',
            ]
        out += [""]
    return "\n".join(out)


def policy_file(name: str, run_dir: Path) -> Path:
    """The policy to run: berth's as shipped; a baseline or another preset as shipped plus the coding
    class table; a variant as its preset with the variant's replacements, plus the table."""
    variant = VARIANTS.get(name)
    shipped = POLICY_DIR / preset_file(variant.preset if variant else name)
    if name == BERTH:
        return shipped
    text = shipped.read_text()
    base = _before_slo(text if variant is None else variant.apply(text))
    coding = (POLICY_DIR / POLICIES[BERTH]).read_text()
    table = coding[coding.index("\n[slo]\n") + 1 :]  # [slo] ... [tasks]: the end of the preset
    path = run_dir / f"{shipped.stem if variant is None else name}.toml"
    path.write_text(
        f"{base}\n# The coding-assistant's SLO classes (the workload names its task type as the class)\n"
        f"{table}"
    )
    return path


def _before_slo(text: str) -> str:
    """A policy file's text up to its [slo] table (the baselines keep theirs at the end)."""
    at = text.find("\n[slo]\n")
    return text if at < 0 else text[: at + 1]


def _models(n_a: int, n_b: int) -> list[str]:
    return [MODELS[0]] * n_a + [MODELS[1]] * n_b


def run_dir_for(
    cfg: BenchConfig, policy: str, *, pattern: str, rate: float, n_a: int, n_b: int, seed: int, config: str
) -> Path:
    tag = f"{config}-{pattern}-r{rate:g}-{n_a}+{n_b}-{policy}" + (f"-s{seed}" if cfg.seeds > 1 else "")
    run_dir = cfg.out / "runs" / tag
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


# --------------------------------------------------------------------- one run, simulated
def run_sim(
    cfg: BenchConfig,
    policy: str,
    *,
    pattern: str,
    rate: float,
    n_a: int,
    n_b: int,
    seed: int,
    config: str = TUNED,
) -> RunResult:
    """One run on the offline fleet simulator, from the files the live path would start processes with
    (at speed 1), kept in the run's directory."""
    t0 = time.perf_counter()
    run_dir = run_dir_for(cfg, policy, pattern=pattern, rate=rate, n_a=n_a, n_b=n_b, seed=seed, config=config)
    fleet_path = run_dir / "fleet.toml"
    fleet_path.write_text(fleet_file(n_a, n_b, SIM_SPEED, config=config))
    policy_path = policy_file(policy, run_dir)
    urls = [(SIM_URL.format(i), m) for i, m in enumerate(_models(n_a, n_b))]
    gw = run_dir / "gateway.toml"
    gw.write_text(gateway_toml(urls, port=SIM_PORT, policy=policy_path, speed=SIM_SPEED, config=config))
    opts = SimOptions(
        policy=policy_path,
        fleet=tuple(load_fleet_file(fleet_path)),
        gateway=gw,
        workload=f"coding:{pattern}",
        rate=rate,
        duration_s=cfg.duration_s,
        seed=seed,
        models=MODELS,
        request_timeout_s=REQUEST_TIMEOUT_SIM_S,
        stall_timeout_s=STALL_TIMEOUT_SIM_S,
        drain_timeout_s=cfg.drain_sim_s,
        sample_every_s=UTIL_SAMPLE_SIM_S,
    )
    report = simulate(opts)
    (run_dir / "loadgen.json").write_bytes(report.to_json())
    if cfg.record:
        write_record(run_dir / "record.jsonl", opts, report.requests)
    data = report.data
    n = len(report.tasks)
    util = data.get("fleet", {}).get("utilization")
    return RunResult(
        policy=policy,
        pattern=pattern,
        rate=rate,
        endpoints=(n_a, n_b),
        wall_s=time.perf_counter() - t0,
        tasks=task_stats(data, SIM_SPEED),
        overall_goodput=round(sum(1 for t in report.tasks if t.met) / n, 4) if n else None,
        request_goodput=data["overall"]["goodput"],
        utilization=None if util is None else round(util, 4),
        busy_share=None,
        cpu={},
        valid=True,
        errors=dict(data.get("errors_by_kind", {})),
        berth_rejections=sum(data.get("rejections_by_reason", {}).values()),
        seed=seed,
        config=config,
        mode="sim",
        left_out=tuple(data.get("simulation", {}).get("left_out", ())),
    )


def write_record(path: Path, opts: SimOptions, requests: Sequence[RequestResult]) -> None:
    """What `berth-loadgen run --record` writes, for a simulated run: each call's trace fields (from the
    run's schedule, rebuilt from its seed as the simulator builds it) and what the client observed."""
    run_opts = RunOptions(
        target="sim",
        workload=opts.workload,
        rate=opts.rate,
        duration_s=opts.duration_s,
        arrival=opts.arrival,
        cv=opts.cv,
        seed=opts.seed,
    )
    tasks = {t.index: t for t in build_schedule(get_workload(opts.workload), run_opts)}
    lines = []
    for r in requests:
        task = tasks[r.task_index]
        line = trace_line(task, r.call_index, r.model, task.at_s)
        line["observed"] = r.observed()
        lines.append(line)
    lines.sort(key=lambda x: (x["at"], x["observed"]["sent_at"]))
    with path.open("wb") as f:
        for line in lines:
            f.write(orjson.dumps(line))
            f.write(b"\n")


# --------------------------------------------------------------------- processes (live)
class UtilSampler:
    """Every `period_s`, each endpoint's `/sim/state`: busy when it runs at least one request."""

    def __init__(self, urls: Sequence[str], period_s: float) -> None:
        self.urls = list(urls)
        self.period_s = period_s
        self.samples = 0
        self.busy = 0
        self.busy_s0: dict[str, float] = {}
        self.busy_s1: dict[str, float] = {}

    async def _states(self, s: aiohttp.ClientSession) -> list[dict[str, Any]]:
        async def one(url: str) -> dict[str, Any]:
            async with s.get(url + "/sim/state") as r:
                doc: dict[str, Any] = orjson.loads(await r.read())
                return doc

        return list(await asyncio.gather(*(one(u) for u in self.urls)))

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as s:
            first = await self._states(s)
            self.busy_s0 = {st["url"]: float(st["stats"]["busy_s"]) for st in first}
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.period_s)
                if stop.is_set():
                    break
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    for st in await self._states(s):
                        self.samples += 1
                        self.busy += st["running"] > 0
            last = await self._states(s)
            self.busy_s1 = {st["url"]: float(st["stats"]["busy_s"]) for st in last}

    @property
    def utilization(self) -> float | None:
        return self.busy / self.samples if self.samples else None

    def busy_share(self, wall_s: float) -> float | None:
        if not self.busy_s1 or wall_s <= 0:
            return None
        total = sum(self.busy_s1[u] - self.busy_s0.get(u, 0.0) for u in self.busy_s1)
        return total / (wall_s * len(self.busy_s1))


# --------------------------------------------------------------------- one run, live
async def run_live(
    cfg: BenchConfig,
    policy: str,
    *,
    pattern: str,
    rate: float,
    n_a: int,
    n_b: int,
    seed: int,
    config: str = TUNED,
) -> RunResult:
    """One run over HTTP: the engine simulator and berth as processes, at `cfg.speed`."""
    run_dir = run_dir_for(cfg, policy, pattern=pattern, rate=rate, n_a=n_a, n_b=n_b, seed=seed, config=config)
    s = cfg.speed
    fleet_path = run_dir / "fleet.toml"
    fleet_path.write_text(fleet_file(n_a, n_b, s, config=config))

    def gateway_for(urls: Sequence[str], port: int) -> str:
        pairs = list(zip(urls, _models(n_a, n_b), strict=True))
        return gateway_toml(pairs, port=port, policy=policy_file(policy, run_dir), speed=s, config=config)

    async with live_processes(run_dir, fleet_path, n_a + n_b, gateway_for) as live:
        opts = RunOptions(
            target=live.base,
            workload=f"coding:{pattern}",
            rate=rate * s,
            duration_s=cfg.duration_s / s,
            seed=seed,
            models=MODELS,
            slo_scale=1.0 / s,
            gap_scale=1.0 / s,
            drain_timeout_s=cfg.drain_sim_s / s,
            request_timeout_s=REQUEST_TIMEOUT_SIM_S / s,
            stall_timeout_s=STALL_TIMEOUT_SIM_S / s,
            watch_pids=live.watch_pids,
            record=run_dir / "record.jsonl" if cfg.record else None,
        )
        sampler = UtilSampler(live.urls, UTIL_SAMPLE_SIM_S / s)
        stop = asyncio.Event()
        t0 = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(sampler.run(stop), name="utilization-sampler")
            try:
                report = await run_workload(opts)
            finally:
                stop.set()
        wall = time.monotonic() - t0
        rq = live.runqueue_shares(wall)
        (run_dir / "loadgen.json").write_bytes(report.to_json())
        berth_rejections = counter_total(await berth_metrics(live.base), "berth_rejections")
    return summarize(
        policy,
        report.data,
        report.tasks,
        pattern=pattern,
        rate=rate,
        endpoints=(n_a, n_b),
        speed=s,
        sampler=sampler,
        wall=wall,
        runqueue=rq,
        berth_rejections=berth_rejections,
        seed=seed,
        config=config,
    )


async def run_one(
    cfg: BenchConfig,
    policy: str,
    *,
    pattern: str,
    rate: float,
    n_a: int,
    n_b: int,
    seed: int | None = None,
    config: str = TUNED,
) -> RunResult:
    """One run of `policy` on `n_a` + `n_b` endpoints: on the simulator, or live with `cfg.live`."""
    seed = cfg.seed if seed is None else seed
    if cfg.live:
        return await run_live(
            cfg, policy, pattern=pattern, rate=rate, n_a=n_a, n_b=n_b, seed=seed, config=config
        )
    return run_sim(cfg, policy, pattern=pattern, rate=rate, n_a=n_a, n_b=n_b, seed=seed, config=config)


def task_stats(data: dict[str, Any], speed: float) -> dict[str, dict[str, Any]]:
    """Per task type: count, goodput, p95 latency and SLA in simulated ms (live figures times `speed`)."""
    tasks: dict[str, dict[str, Any]] = {}
    for name, st in data.get("tasks", {}).items():
        p95 = st.get("latency_p95_ms")
        tasks[name] = {
            "count": st["count"],
            "goodput": st["goodput"],
            "latency_p95_ms": None if p95 is None else round(p95 * speed, 1),
            "sla_ms": None if st.get("sla_ms") is None else round(st["sla_ms"] * speed, 1),
        }
    return tasks


def summarize(
    policy: str,
    data: dict[str, Any],
    task_results: Sequence[Any],
    *,
    pattern: str,
    rate: float,
    endpoints: tuple[int, int],
    speed: float,
    sampler: UtilSampler,
    wall: float,
    runqueue: dict[str, float],
    berth_rejections: int,
    seed: int,
    config: str = TUNED,
) -> RunResult:
    """A live run's result, judged valid when neither berth nor loadgen was CPU-starved."""
    n = len(task_results)
    met = sum(1 for t in task_results if t.met)
    cpu, valid, notes = cpu_validity(data, runqueue)
    return RunResult(
        policy=policy,
        pattern=pattern,
        rate=rate,
        endpoints=endpoints,
        wall_s=wall,
        tasks=task_stats(data, speed),
        overall_goodput=round(met / n, 4) if n else None,
        request_goodput=data["overall"]["goodput"],
        utilization=None if sampler.utilization is None else round(sampler.utilization, 4),
        busy_share=None if (b := sampler.busy_share(wall)) is None else round(b, 4),
        cpu=cpu,
        valid=valid,
        errors=dict(data.get("errors_by_kind", {})),
        berth_rejections=berth_rejections,
        notes=notes,
        seed=seed,
        config=config,
    )


# --------------------------------------------------------------------- the benchmark
async def sweep(cfg: BenchConfig, log: Any) -> list[RunResult]:
    out: list[RunResult] = []
    n = cfg.endpoints_per_model
    for config in cfg.configs:
        for pattern in cfg.patterns:
            for rate in cfg.rates_for(pattern):
                for seed in cfg.seed_list():
                    for policy in cfg.policies:
                        r = await run_one(
                            cfg, policy, pattern=pattern, rate=rate, n_a=n, n_b=n, seed=seed, config=config
                        )
                        log(line(r))
                        out.append(r)
    return out


async def run_seeds(cfg: BenchConfig, policy: str, n_a: int, n_b: int, log: Any) -> list[RunResult]:
    """`policy` on `n_a` + `n_b` endpoints at Aladdin's rate (tuned), once per seed."""
    out: list[RunResult] = []
    for seed in cfg.seed_list():
        r = await run_one(
            cfg, policy, pattern=cfg.aladdin_pattern, rate=cfg.aladdin_rate, n_a=n_a, n_b=n_b, seed=seed
        )
        log(line(r))
        out.append(r)
    return out


def mean_goodput(runs: Sequence[RunResult]) -> float | None:
    vals = [r.overall_goodput for r in runs if r.overall_goodput is not None]
    return sum(vals) / len(vals) if vals else None


async def fewest_endpoints(cfg: BenchConfig, policy: str, log: Any) -> tuple[int | None, list[RunResult]]:
    """The fewest endpoints (both models, split MODEL_A_SHARE) keeping overall goodput >= 0.95 (the mean
    over the seeds) at `aladdin_rate`: a binary search over 4 .. 2 × endpoints_per_model (goodput falls
    as endpoints go)."""
    runs: list[RunResult] = []
    lo, hi = 4, 2 * cfg.endpoints_per_model
    best: int | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        a, b = split(mid)
        rr = await run_seeds(cfg, policy, a, b, log)
        runs += rr
        g = mean_goodput(rr)
        if g is not None and g >= GOODPUT_TARGET:
            best, hi = mid, mid - 1
        else:
            lo = mid + 1
    return best, runs


async def at_ratio_fleet(
    cfg: BenchConfig, fewest: dict[str, int | None], done: Sequence[RunResult], log: Any
) -> list[RunResult]:
    """Each searched policy on the fleet the ratio target asks for (`ratio_fleet` of the baseline's
    fewest), unless its search ran that fleet already: how far from the goodput target each is there."""
    base = fewest.get(cfg.aladdin_policies[1])
    if base is None:
        return []
    a, b = split(ratio_fleet(base))
    ran = {(r.policy, r.endpoints) for r in done}
    out: list[RunResult] = []
    for policy in cfg.aladdin_policies:
        if (policy, (a, b)) not in ran:
            out += await run_seeds(cfg, policy, a, b, log)
    return out


def line(r: RunResult) -> str:
    per = " ".join(f"{t[:4]}={r.tasks.get(t, {}).get('goodput') or 0:.2f}" for t in TASK_TYPES)
    head = (
        f"{r.config} {r.pattern} rate={r.rate:g} seed={r.seed} endpoints={r.endpoints[0]}+{r.endpoints[1]} "
        f"{r.policy:18} goodput={r.overall_goodput} ({per}) util={r.utilization}"
    )
    if r.mode == "sim":
        return f"{head} rejected={r.berth_rejections} wall={r.wall_s:.1f}s"
    flag = "" if r.valid else "  INVALID: " + "; ".join(r.notes)
    return (
        f"{head} cpu berth={r.cpu['berth']['cpu_share']} loadgen={r.cpu['loadgen']['cpu_share']} "
        f"wall={r.wall_s:.0f}s{flag}"
    )


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
