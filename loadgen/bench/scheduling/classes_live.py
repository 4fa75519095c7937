"""The classes benchmark's confirming live run: Chiron's setting over real HTTP, beside the
offline simulator's figures for the same setting, seed and scale.

    berth-loadgen bench classes --live --out DIR              # (a) and (d) at 0.25 req/s, seed 0 (~15 min)
    berth-loadgen bench classes --live --quick --out DIR      # a small backlog (about a minute)
    flock /tmp/berth-heavy.lock berth-loadgen bench classes --live --speed 2 --out DIR   # the measurement

Setting: the simulated benchmark's (`classes`), built by its own functions: the fleet file
(8 `fleet-7b` endpoints, 2 interactive / 4 mixed / 2 batch, 128 seats and a 64 k-token KV cache each,
priority scheduling), the policy of each configuration (`policy_text`), the `chat-backlog:N` workload with
the same seed. Live, the fleet runs in `berth-engine-sim --fleet` sped up `--speed` times and berth in
`berth serve`, with the simulated run's gateway settings and every time in them divided by the speed
(queue wait, scrape and refresh intervals, refits, the prior's latencies, chiron's `interval_s`); each
endpoint's class and cap are on its `[[endpoints]]` item. The client (the loadgen runner) replays the
simulator's schedule with every arrival divided by the speed and sends each request's SLO scaled by
1 / speed (`x-berth-ttft-ms`, `x-berth-itl-ms`), so berth judges the scaled targets. Every figure of the
report is scaled back to simulated seconds.

The backlog: every batch request is queued at t = 0 and waits in berth's queue, and each one holds a
client connection until it finishes (the OpenAI API has no other way to wait for an answer). loadgen
holds one socket per request (backlog + the interactive requests in flight) and berth one per client plus
one per engine seat (8 x 128). The run raises its soft RLIMIT_NOFILE (inherited by berth and the engine
simulator) to what that needs and refuses to start when the hard limit is lower (`ulimit -Hn`); berth's
upstream pool is set above the fleet's seats so scrapes never wait for a streaming connection.

Figures (the simulated benchmark's, `classes_report.summarize`): interactive attainment, the share of
requests that kept their ITL target, batch throughput and backlog completion time, and from berth's
/metrics preemptions, resumes and recomputed tokens (berth counts a resume per preempted request that
finished, and as recomputed the tokens the client had at each preemption; the simulator a resume per
re-dispatch of a preempted request, and the prompt plus those tokens). Over time (sampled from
/admin/fleet): berth's queue and the caps in force per class (`live_timeline.png`).

Validity: a live run is valid only when neither berth nor loadgen was CPU-starved (`live_stack`:
at most 80 % of a core each, at most 10 % of the run waiting for a CPU). Live confirms the simulator when
both live runs are valid, the targets' verdicts at this rate are the same on both paths ((d) keeps
>= 0.99 attainment; (d)'s batch throughput >= 0.9 x (a)'s), and each run's figures agree within the
tolerances (`classes_live_report.TOLERANCES`).

Output: DIR/report.md, DIR/report.json, DIR/live_timeline.png (with the `plot` extra), per run
DIR/live/TAG/ (fleet.toml, gateway.toml, policy.toml, loadgen.json, berth.log, sim.log) and the simulated
runs' files under DIR/sim/runs/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import config_or_reason, say
from loadgen.bench.scheduling import classes
from loadgen.bench.scheduling.classes_live_report import (
    _live_json,
    _sim_json,
    agreement,
    markdown,
    targets,
    verdict,
)
from loadgen.bench.scheduling.classes_live_setup import (
    DEFAULT_RATE,
    DEFAULT_SEED,
    DEFAULT_SPEED,
    QUICK,
    LiveConfig,
    LiveRun,
    fleet_specs,
    live_fleet_file,
    live_gateway_toml,
    live_policy_text,
    raise_fd_limit,
    schedule,
    sockets_needed,
)
from loadgen.bench.scheduling.classes_report import Run, plot_timeline, summarize
from loadgen.bench.scheduling.live_stack import berth_metrics, counter_total, cpu_validity, live_processes
from loadgen.bench.skeleton import run_bench
from loadgen.fleetsim.timeline import FleetTimeline
from loadgen.report import Report
from loadgen.runner import RunOptions, run_workload


# --------------------------------------------------------------------- one live run
class FleetSampler:
    """Every `period_s`, berth's /admin/fleet into a `FleetTimeline` at simulated times (x speed): busy
    endpoints, requests berth runs, engine waiting gauges, berth's queue, caps in force per class."""

    def __init__(self, base: str, period_s: float, speed: float, n: int) -> None:
        self.base = base
        self.period_s = period_s
        self.speed = speed
        self.timeline = FleetTimeline(n)

    def _add(self, doc: dict[str, Any], t: float) -> None:
        eps = doc.get("endpoints") or []
        caps: dict[str, int] = {}
        for e in eps:
            caps[e["class"]] = caps.get(e["class"], 0) + int(e["cap"])
        queued = (doc.get("models") or {}).get(classes.MODEL, {}).get("queued_total", 0)
        self.timeline.add(
            t,
            sum(1 for e in eps if e["inflight"] > 0),
            sum(int(e["inflight"]) for e in eps),
            sum(int(e["gauges"]["waiting"] or 0) for e in eps),
            int(queued),
            caps,
        )

    async def run(self, stop: asyncio.Event, t0: float) -> None:
        async with aiohttp.ClientSession() as s:
            while not stop.is_set():
                now = time.monotonic()
                with contextlib.suppress(aiohttp.ClientError, OSError, KeyError, TypeError):
                    async with s.get(self.base + "/admin/fleet") as r:
                        self._add(orjson.loads(await r.read()), (now - t0) * self.speed)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.period_s)


def scaled_back(report: Report, speed: float, timeline: dict[str, Any]) -> Report:
    """The live report's requests with every time (and SLO) multiplied by `speed`, and the sampled
    timeline: what `summarize` reads of a simulated report."""
    s = speed

    def up(v: float | None) -> float | None:
        return None if v is None else v * s

    requests = [
        dataclasses.replace(
            r,
            sent_at_s=r.sent_at_s * s,
            ttft_s=up(r.ttft_s),
            e2e_s=up(r.e2e_s),
            atgt_s=up(r.atgt_s),
            slo=r.slo.scaled(s),
        )
        for r in report.requests
    ]
    return Report(data={"fleet": {"timeline": timeline}}, requests=requests, tasks=report.tasks)


async def run_live(cfg: LiveConfig, config: str) -> LiveRun:
    """One configuration over HTTP at `cfg.speed`."""
    s = cfg.speed
    run_dir = cfg.out / "live" / f"{config}-r{cfg.rate:g}-s{cfg.seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    fleet_path = run_dir / "fleet.toml"
    fleet_path.write_text(live_fleet_file(s))
    policy = run_dir / "policy.toml"
    policy.write_text(live_policy_text(config, s))
    n = len(fleet_specs())

    def gateway_for(urls: Sequence[str], port: int) -> str:
        return live_gateway_toml(urls, port=port, policy=policy, speed=s)

    tasks = schedule(cfg)
    async with live_processes(run_dir, fleet_path, n, gateway_for) as live:
        opts = RunOptions(
            target=live.base,
            workload=f"chat-backlog:{cfg.backlog}",
            rate=cfg.rate * s,
            duration_s=cfg.duration_s / s,
            seed=cfg.seed,
            models=(classes.MODEL,),
            slo_scale=1.0 / s,
            slo_headers=True,
            request_timeout_s=(classes.DRAIN_S + cfg.duration_s) / s,
            stall_timeout_s=classes.DRAIN_S / s,
            drain_timeout_s=classes.DRAIN_S / s,
            watch_pids=live.watch_pids,
            record=run_dir / "record.jsonl" if cfg.record else None,
        )
        sampler = FleetSampler(live.base, classes.SAMPLE_S / s, s, n)
        stop = asyncio.Event()
        t0 = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(sampler.run(stop, t0), name="fleet-sampler")
            try:
                report = await run_workload(opts, schedule=tasks)
            finally:
                stop.set()
        wall = time.monotonic() - t0
        runqueue = live.runqueue_shares(wall)
        page = await berth_metrics(live.base)
    (run_dir / "loadgen.json").write_bytes(report.to_json())
    timeline = sampler.timeline.summary(n)["timeline"]
    run = Run(config, cfg.rate, cfg.seed, classes.ENGINE_SEATS)
    run.figures, run.timeline = summarize(scaled_back(report, s, timeline))
    run.figures["preemptions"] = counter_total(page, "berth_preemptions")
    run.figures["resumes"] = counter_total(page, "berth_resumes")
    run.figures["recomputed_tokens"] = counter_total(page, "berth_recomputed_tokens")
    run.figures["berth_rejections"] = counter_total(page, "berth_rejections")
    run.figures["errors"] = dict(report.data.get("errors_by_kind", {}))
    run.wall_s = wall
    cpu, valid, notes = cpu_validity(report.data, runqueue)
    out = LiveRun(run, cpu, valid, notes, wall)
    (run_dir / "figures.json").write_bytes(orjson.dumps(_live_json(out), option=orjson.OPT_INDENT_2))
    return out


# --------------------------------------------------------------------- the command
async def bench(cfg: LiveConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    started = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    sim_cfg = cfg.sim_config()
    sims: list[Run] = []
    for config in cfg.configs:
        r = await asyncio.to_thread(classes.run_one, sim_cfg, config, cfg.rate, cfg.seed)
        log(f"sim  {classes.run_line(r, cap=False)}")
        sims.append(r)
    lives: list[LiveRun] = []
    for config in cfg.configs:
        lr = await run_live(cfg, config)
        flag = "" if lr.valid else "  INVALID: " + "; ".join(lr.notes)
        cpu = f"cpu berth={lr.cpu['berth']['cpu_share']} loadgen={lr.cpu['loadgen']['cpu_share']}"
        log(f"live {classes.run_line(lr.run, cap=False)} {cpu}{flag}")
        lives.append(lr)
    sim_fig = {r.config: r.figures for r in sims}
    live_fig = {r.run.config: r.run.figures for r in lives}
    result: dict[str, Any] = {
        "setup": {
            "model": classes.MODEL,
            "profile": classes.PROFILE,
            "fleet": ", ".join(f"{n} {c}" for c, n in classes.FLEET),
            "rate": cfg.rate,
            "seed": cfg.seed,
            "backlog": cfg.backlog,
            "duration_s": cfg.duration_s,
            "speed": cfg.speed,
            "configs": list(cfg.configs),
            "quick": cfg.quick,
            "sockets_needed": sockets_needed(cfg),
            "elapsed_s": round(time.perf_counter() - started, 1),
        },
        "sim": [_sim_json(r) for r in sims],
        "live": [_live_json(r) for r in lives],
        "agreement": {c: agreement(sim_fig[c], live_fig[c]) for c in cfg.configs},
        "targets": {"sim": targets(sim_fig), "live": targets(live_fig)},
    }
    v, why = verdict(result)
    result["verdict"] = {"verdict": v, "why": why}
    md = markdown(result)
    (cfg.out / "report.md").write_text(md)
    plotted = plot_timeline([r.run for r in lives], cfg.rate, cfg.out / "live_timeline.png")
    result["plot"] = "live_timeline.png" if plotted is None else plotted
    (cfg.out / "report.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    log(md)
    if plotted is not None:
        log(plotted)
    return result


def build_parser() -> argparse.ArgumentParser:
    """The simulated benchmark's options, and the live run's."""
    p = classes.build_parser()
    p.description = (p.description or "") + " --live: the confirming run over HTTP (see classes_live)."
    live = p.add_argument_group("--live", "the confirming run over HTTP, beside the simulator's figures")
    live.add_argument(
        "--live",
        action="store_true",
        help=f"(a) and (d) at one rate (default {DEFAULT_RATE:g}, or --rates RATE) and one seed, as "
        "processes over HTTP, each beside the simulator's run of the same setting",
    )
    live.add_argument("--speed", type=float, help=f"the engines' speed-up (default {DEFAULT_SPEED:g})")
    live.add_argument("--seed", type=int, help=f"the live run's seed (default {DEFAULT_SEED})")
    return p


def config_from_args(a: argparse.Namespace) -> LiveConfig:
    """The live run's configuration from the options; raises ValueError with the reason for a refusal
    (also when this machine cannot hold the backlog's sockets)."""
    if a.seeds is not None or a.caps:
        raise ValueError("--live runs one seed (--seed) and no cap sweep: drop --seeds and --caps")
    rates = [float(x) for x in a.rates.split(",")] if a.rates else []
    if len(rates) > 1:
        raise ValueError("--live runs one rate: --rates RATE")
    base: dict[str, Any] = dict(QUICK) if a.quick else {}
    for key, value in (
        ("speed", a.speed),
        ("rate", rates[0] if rates else None),
        ("seed", a.seed),
        ("backlog", a.backlog),
        ("duration_s", a.duration),
    ):
        if value is not None:
            base[key] = value
    cfg = LiveConfig(out=a.out, quick=a.quick, **base)
    if cfg.speed <= 0 or cfg.rate <= 0 or cfg.backlog < 0 or cfg.duration_s <= 0 or cfg.seed < 0:
        raise ValueError("need speed > 0, rate > 0, backlog >= 0, duration > 0 and seed >= 0")
    refused = raise_fd_limit(sockets_needed(cfg))
    if refused is not None:
        raise ValueError(refused)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    """`berth-loadgen bench classes`: the simulated benchmark (`classes.main`), or with --live this
    module's confirming run. (The entry lives here, not in `classes`, so that the import goes one way.)"""
    args = build_parser().parse_args(argv)
    if not args.live:
        if args.speed is not None or args.seed is not None:
            print("berth-loadgen bench classes: --speed and --seed are for --live", file=sys.stderr)
            return 2
        return classes.main(argv)
    cfg = config_or_reason(lambda: config_from_args(args))

    def run(c: LiveConfig) -> dict[str, Any]:
        import uvloop

        return uvloop.run(bench(c, say))

    return run_bench(
        BENCHMARKS["classes"], cfg, run, passed=lambda r: bool(r["verdict"]["verdict"] == "CONFIRMS")
    )


if __name__ == "__main__":
    sys.exit(main())
