"""The classes benchmark's confirming live run (issue 14): Chiron's setting over real HTTP, beside the
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
tolerances (`TOLERANCES`).

Output: DIR/report.md, DIR/report.json, DIR/live_timeline.png (with the `plot` extra), per run
DIR/live/TAG/ (fleet.toml, gateway.toml, policy.toml, loadgen.json, berth.log, sim.log) and the simulated
runs' files under DIR/sim/runs/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import resource
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import config_or_reason, say
from loadgen.bench.scheduling import classes
from loadgen.bench.scheduling.classes_report import Run, plot_timeline, summarize
from loadgen.bench.scheduling.live_stack import berth_metrics, counter_total, cpu_validity, live_processes
from loadgen.bench.skeleton import run_bench
from loadgen.engine_sim.fleet import parse_fleet
from loadgen.engine_sim.profiles import get_profile
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim.gateway import endpoint_ids
from loadgen.fleetsim.timeline import FleetTimeline
from loadgen.report import Report
from loadgen.runner import RunOptions, build_schedule, run_workload
from loadgen.workloads import get_workload
from loadgen.workloads.base import TaskSpec

CONFIGS: Final = (classes.BASELINE, classes.BERTH)
DEFAULT_RATE: Final = classes.DEFAULT_RATES[0]  # where (a) is below 0.90: the targets' rate
DEFAULT_SEED: Final = 0
# The setting the simulated figures in docs/benchmarks.md were measured at (3 000 batch requests, 240 s of
# arrivals).
DEFAULT_BACKLOG: Final = 3000
DEFAULT_DURATION_S: Final = 240.0
DEFAULT_SPEED: Final = 2.0
QUICK: Final = {"rate": 4.0, "backlog": 150, "duration_s": 30.0}
#: Sockets a process needs beside its requests' (its listeners, log files, the loop's own, scrapes).
FD_SPARE: Final = 256
#: berth's upstream pool: above the fleet's seats (8 x 128), so scrapes never wait for a stream's socket.
POOL_TOTAL: Final = 2048
#: berth's connect timeout to the engines (default 5 s). Every batch request arrives at t = 0: berth's
#: loop is busy for several seconds admitting them (each arrival and each completion scans the whole
#: queue, O(queue)), and the first wave's 1 024 new engine connections then miss a 5 s bound (with the
#: default, about a third of the first wave failed). The live run measures scheduling, not that burst.
CONNECT_TIMEOUT_S: Final = 30.0
#: How far live may be from the simulator for a figure to agree: absolute for attainment and the ITL
#: share (one interactive request of the default run's ~50 is 0.02), relative for the rest.
TOLERANCES: Final = {
    "interactive_attainment": ("abs", 0.05),
    "itl_kept": ("abs", 0.02),
    "batch_tokens_per_s": ("rel", 0.10),
    "backlog_done_s": ("rel", 0.10),
}


@dataclass(frozen=True, slots=True)
class LiveConfig:
    out: Path
    rate: float = DEFAULT_RATE
    seed: int = DEFAULT_SEED
    backlog: int = DEFAULT_BACKLOG
    duration_s: float = DEFAULT_DURATION_S
    speed: float = DEFAULT_SPEED
    configs: tuple[str, ...] = CONFIGS
    quick: bool = False
    record: bool = False  # each live run's requests to live/TAG/record.jsonl

    def sim_config(self) -> classes.Config:
        """The simulated benchmark's configuration for the same setting (files under out/sim)."""
        return classes.Config(
            out=self.out / "sim",
            rates=(self.rate,),
            seeds=1,
            backlog=self.backlog,
            duration_s=self.duration_s,
            quick=self.quick,
        )


@dataclass(slots=True)
class LiveRun:
    run: Run  # figures and timeline in simulated seconds
    cpu: dict[str, dict[str, Any]] = field(default_factory=dict)
    valid: bool = True
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0


# --------------------------------------------------------------------- files
def live_fleet_file(speed: float) -> str:
    """The simulated benchmark's fleet file with the engines sped up `speed` times."""
    text = classes.fleet_file(classes.ENGINE_SEATS)
    head = "[defaults]\n"
    if not text.startswith(head):
        raise ValueError("classes.fleet_file no longer starts with [defaults]: update classes_live")
    return f"{head}speed = {speed}\n{text[len(head) :]}"


def fleet_specs() -> list[EndpointSpec]:
    """The fleet's endpoints in the file's order (the engine simulator serves them in that order)."""
    return parse_fleet(tomllib.loads(classes.fleet_file(classes.ENGINE_SEATS)))


def live_policy_text(config: str, speed: float) -> str:
    """The configuration's policy (`classes.policy_text`) with chiron's interval divided by the speed."""
    text = classes.policy_text(config)
    if "\n[concurrency]\n" not in text:
        return text
    old = "interval_s = 2.0"
    if old not in text:
        raise ValueError(f"the preset's [concurrency] no longer has {old!r}: update classes_live")
    return text.replace(old, f"interval_s = {2.0 / speed:g}", 1)


def live_gateway_toml(urls: Sequence[str], *, port: int, policy: Path, speed: float) -> str:
    """berth's configuration: the simulated run's (`classes.gateway_toml`, with the defaults it leaves
    to the simulator) with every time divided by `speed`, the listener, and one item per endpoint."""
    s = speed
    lat = get_profile(classes.PROFILE).latency
    out = [
        "[server]",
        f'listen = "127.0.0.1:{port}"',
        'log_level = "warning"',
        "drain_timeout_s = 2.0",
        "[limits]",
        "max_queue_per_model = 100000",
        f"max_queue_wait_s = {7200.0 / s:g}",
        "[upstream]",
        f"connect_timeout_s = {CONNECT_TIMEOUT_S:g}",
        f"pool_per_host = {classes.ENGINE_SEATS + 16}",
        f"pool_total = {POOL_TOTAL}",
        "[scrape]",
        f"interval_s = {2.0 / s:g}",
        f"stale_after_s = {10.0 / s:g}",
        "[telemetry]",
        f"refresh_interval_s = {1.0 / s:g}",
        f"refit_interval_s = {5.0 / s:g}",
        f"first_fit_interval_s = {1.0 / s:g}",
        f"kv_capacity_tokens = {classes.KV_TOKENS}",
        *lat.scaled(s).prior_toml(),
        "h = 1.0",
        "j = 1.0",
        "[policy]",
        f"file = {orjson.dumps(str(policy)).decode()}",
        "",
    ]
    specs = fleet_specs()
    if len(specs) != len(urls):
        raise ValueError(f"{len(urls)} URLs for a fleet of {len(specs)} endpoints")
    for eid, spec, url in zip(endpoint_ids(specs), specs, urls, strict=True):
        out += [
            "[[endpoints]]",
            f'id = "{eid}"',
            f'url = "{url}"',
            f'engine = "{spec.flavor}"',
            f'models = ["{classes.MODEL}"]',
            f'class = "{spec.instance_class}"',
            f"cap = {spec.cap}",
            f'scheduling = "{spec.scheduling_policy}"',
            "",
        ]
    return "\n".join(out)


def schedule(cfg: LiveConfig) -> list[TaskSpec]:
    """The simulator's schedule for the setting (`build_schedule`, same workload and seed), every arrival
    divided by the speed."""
    opts = RunOptions(
        target="sim",
        workload=f"chat-backlog:{cfg.backlog}",
        rate=cfg.rate,
        duration_s=cfg.duration_s,
        seed=cfg.seed,
    )
    tasks = build_schedule(get_workload(opts.workload), opts)
    return [dataclasses.replace(t, at_s=t.at_s / cfg.speed) for t in tasks]


def sockets_needed(cfg: LiveConfig) -> int:
    """File descriptors the busiest process (berth) needs: a client socket per request that may be
    waiting at once (the whole backlog, plus the interactive requests), one per engine seat, and spare."""
    interactive = math.ceil(cfg.rate * cfg.duration_s * 2) + 16  # generous: Poisson, and in flight at once
    seats = sum(n for _, n in classes.FLEET) * classes.ENGINE_SEATS
    return cfg.backlog + interactive + seats + FD_SPARE


def raise_fd_limit(need: int) -> str | None:
    """Raise this process's soft RLIMIT_NOFILE to `need` (children inherit it); why not, or None."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard != resource.RLIM_INFINITY and hard < need:
        return (
            f"the run needs {need} open files per process (the backlog's client sockets wait in berth), "
            f"the hard limit is {hard}: raise it (ulimit -Hn) or use a smaller --backlog"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return None


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


# --------------------------------------------------------------------- the comparison
def agreement(sim: dict[str, Any], live: dict[str, Any]) -> list[dict[str, Any]]:
    """Per figure of `TOLERANCES`: both values, the difference and whether it is within tolerance."""
    out = []
    for key, (kind, tol) in TOLERANCES.items():
        a, b = sim.get(key), live.get(key)
        if a is None or b is None:
            out.append({"figure": key, "sim": a, "live": b, "diff": None, "agrees": a is None and b is None})
            continue
        diff = b - a if kind == "abs" else ((b - a) / a if a else math.inf)
        out.append({"figure": key, "sim": a, "live": b, "diff": round(diff, 4), "agrees": abs(diff) <= tol})
    return out


def targets(by_config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The targets at this rate on one path's figures: (d) keeps >= 0.99; (d)'s batch >= 0.9 x (a)'s."""
    a, d = by_config.get(classes.BASELINE), by_config.get(classes.BERTH)
    if a is None or d is None:
        return {}
    ratio = d["batch_tokens_per_s"] / a["batch_tokens_per_s"] if a["batch_tokens_per_s"] else math.nan
    return {
        "d_attainment": d["interactive_attainment"],
        "d_attainment_pass": d["interactive_attainment"] >= 0.99,
        "batch_ratio": round(ratio, 4),
        "batch_ratio_pass": ratio >= 0.9,
    }


def verdict(result: dict[str, Any]) -> tuple[str, list[str]]:
    """Whether live confirms the simulator, and why not."""
    why: list[str] = []
    invalid = [r["config"] for r in result["live"] if not r["valid"]]
    if invalid:
        why.append(f"live run(s) not valid (CPU-starved): {', '.join(invalid)}")
    ts, tl = result["targets"]["sim"], result["targets"]["live"]
    for key in ("d_attainment_pass", "batch_ratio_pass"):
        if key in ts and ts[key] != tl.get(key):
            why.append(f"target verdict {key} differs: sim {ts[key]}, live {tl.get(key)}")
    for config, rows in result["agreement"].items():
        why += [
            f"{config} {row['figure']}: sim {row['sim']}, live {row['live']} (diff {row['diff']})"
            for row in rows
            if not row["agrees"]
        ]
    if invalid:
        if len(why) == 1:
            why.append("otherwise the figures agree within the tolerances and so do the targets' verdicts")
        return "NOT JUDGED", why
    return ("CONFIRMS" if not why else "DIFFERS"), why


def _live_json(r: LiveRun) -> dict[str, Any]:
    return {
        "config": r.run.config,
        "rate": r.run.rate,
        "seed": r.run.seed,
        "wall_s": round(r.wall_s, 1),
        "cpu": r.cpu,
        "valid": r.valid,
        "notes": r.notes,
        **r.run.figures,
        "timeline": r.run.timeline,
    }


def _sim_json(r: Run) -> dict[str, Any]:
    return {"config": r.config, "rate": r.rate, "seed": r.seed, "wall_s": round(r.wall_s, 1), **r.figures}


ROWS: Final = (
    ("interactive attainment", "interactive_attainment", "{:.3f}"),
    ("ITL kept (all)", "itl_kept", "{:.4f}"),
    ("batch tok/s", "batch_tokens_per_s", "{:.0f}"),
    ("backlog done (s)", "backlog_done_s", "{:.0f}"),
    ("batch finished", "batch_finished", "{}"),
    ("unfinished", "unfinished", "{}"),
    ("preemptions", "preemptions", "{}"),
    ("resumes", "resumes", "{}"),
    ("recomputed tokens", "recomputed_tokens", "{}"),
)


def _fmt(fmt: str, v: Any) -> str:
    return "n/a" if v is None else fmt.format(v)


def markdown(result: dict[str, Any]) -> str:
    s = result["setup"]
    sims = {r["config"]: r for r in result["sim"]}
    lives = {r["config"]: r for r in result["live"]}
    configs = [c for c in s["configs"] if c in sims or c in lives]
    lines = [
        "# Instance classes: the confirming live run (simulator beside live)",
        "",
        f"Chiron's setting ({s['fleet']}, one model, `{s['profile']}`): interactive chat at {s['rate']:g} "
        f"req/s for {s['duration_s']:g} s and {s['backlog']} batch requests queued at t = 0, seed "
        f"{s['seed']}. Live: `berth serve` and `berth-engine-sim --fleet` as processes over loopback, the "
        f"engines sped up x{s['speed']:g}, every SLO and time in berth's settings divided by it, every "
        "figure below scaled back to simulated seconds. The simulator ran the same files at speed 1.",
        "",
        "| figure | " + " | ".join(f"{c} sim | {c} live" for c in configs) + " |",
        "| --- | " + " | ".join("--- | ---" for _ in configs) + " |",
    ]
    for label, key, fmt in ROWS:
        cells = []
        for c in configs:
            cells += [_fmt(fmt, sims.get(c, {}).get(key)), _fmt(fmt, lives.get(c, {}).get(key))]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    ts, tl = result["targets"]["sim"], result["targets"]["live"]
    if ts and tl:
        lines += [
            "",
            "| target at this rate | sim | live |",
            "| --- | --- | --- |",
            f"| (d) interactive attainment >= 0.99 | {ts['d_attainment']:.3f} "
            f"{_pf(ts['d_attainment_pass'])} | {tl['d_attainment']:.3f} {_pf(tl['d_attainment_pass'])} |",
            f"| (d) batch tok/s >= 0.9x (a)'s | {ts['batch_ratio']:.3f}x {_pf(ts['batch_ratio_pass'])} | "
            f"{tl['batch_ratio']:.3f}x {_pf(tl['batch_ratio_pass'])} |",
        ]
    lines += ["", "## Validity (live)", ""]
    lines += [
        "| configuration | berth CPU | loadgen CPU | engine sim CPU | waited for a CPU (berth / loadgen) "
        "| wall s | valid |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in configs:
        r = lives.get(c)
        if r is None:
            continue
        cpu = r["cpu"]
        lines.append(
            f"| {c} | {_share(cpu['berth']['cpu_share'])} | {_share(cpu['loadgen']['cpu_share'])} | "
            f"{_share(cpu['sim']['cpu_share'])} | {cpu['berth']['runqueue_share'] * 100:.1f} % / "
            f"{cpu['loadgen']['runqueue_share'] * 100:.1f} % | {r['wall_s']:.0f} | "
            f"{'yes' if r['valid'] else 'NO: ' + '; '.join(r['notes'])} |"
        )
    v = result["verdict"]
    lines += ["", f"**Verdict: {v['verdict']}**" + (": " + "; ".join(v["why"]) if v["why"] else ""), ""]
    tol = ", ".join(
        f"{k} ±{t:g}" if kind == "abs" else f"{k} ±{t * 100:g} %" for k, (kind, t) in TOLERANCES.items()
    )
    lines += [
        "Live confirms the simulator when both live runs are valid, the targets' verdicts agree, and each "
        f"figure agrees within: {tol}.",
        "",
        "Counted differently: berth counts a resume per preempted request that finished and, as recomputed, "
        "the tokens the client had at each preemption; the simulator counts a resume per re-dispatch of a "
        "preempted request and, as recomputed, its prompt plus those tokens. Live errors by kind: "
        + ", ".join(f"{c} {lives[c].get('errors') or {}}" for c in configs if c in lives)
        + "; berth's rejections: "
        + ", ".join(f"{c} {lives[c].get('berth_rejections')}" for c in configs if c in lives)
        + ".",
        "",
    ]
    return "\n".join(lines)


def _pf(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _share(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.0f} %"


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
