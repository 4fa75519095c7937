"""One run of the scheduling benchmark (`policies`): on the offline fleet simulator (`run_sim`) or over HTTP
with berth and the engine simulator as processes (`run_live`), its result, and the line that sums it up
(`line`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from loadgen.bench.scheduling.live_stack import berth_metrics, counter_total, cpu_validity, live_processes
from loadgen.bench.scheduling.scheduling_setup import (
    _models,
    fleet_file,
    gateway_toml,
    policy_file,
    run_dir_for,
)
from loadgen.bench.scheduling.scheduling_types import (
    MODELS,
    TASK_TYPES,
    TUNED,
    BenchConfig,
    RunResult,
)
from loadgen.client import RequestResult
from loadgen.engine_sim.fleet import load_fleet_file
from loadgen.fleetsim import SimOptions, simulate
from loadgen.fleetsim.options import schedule_of
from loadgen.runner import RunOptions, run_workload
from loadgen.workloads.trace import trace_line

UTIL_SAMPLE_SIM_S: Final = 2.0  # CATO samples utilization every 2 s
REQUEST_TIMEOUT_SIM_S: Final = 600.0  # the client gives up on a request after this long (simulated s)
STALL_TIMEOUT_SIM_S: Final = 120.0  # ... or after this long without a byte
#: The offline simulator runs in virtual time: no speed-up, so nothing is scaled.
SIM_SPEED: Final = 1.0
#: berth's listen address in a simulated run's gateway.toml (the simulator opens no socket) and its
#: endpoints' URLs there (the simulator reads only [limits], [scrape], [telemetry] and [aliases]).
SIM_PORT: Final = 8080
SIM_URL: Final = "http://e{:03d}.sim"


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
    tasks = {t.index: t for t in schedule_of(opts)}
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
