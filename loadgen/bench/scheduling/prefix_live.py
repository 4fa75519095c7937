"""The prefix-cache benchmark's live confirmation (`berth-loadgen bench prefix --live`): berth and the
real cache-aware routers, each as a process in front of the same simulated fleet (`berth-engine-sim
--fleet`, prefix caching on, a fresh process per router so every cache starts cold), driven by the
loadgen client with the same trace and seed.

Routers (`--routers`, all by default):
- `berth`: `berth serve` with the workload's preset and the approximate prefix index (as the simulator
  runs it); `berth-precise`: the same with the precise source, from the engines' KV events (every
  engine publishes them, whichever router runs, so the fleet is the same) and token ids from their
  /tokenize;
- `vllm-router-cache_aware`, `vllm-router-power_of_two`: vllm-router 0.1.17 from PyPI;
- `sglang-router-cache_aware`: sglang-router 0.3.2 from PyPI (`python -m sglang_router.launch_router`).
Each peer is installed on first use into a virtualenv of its own under ~/.cache/berth/peers/ (pip; the
machine needs PyPI then, never afterwards). A peer that cannot be installed or started is reported as
such and the others still run.

Default: `coding` with repository sessions, one load (1.0), one seed, 60 s of arrivals per router
(`--workloads mooncake --duration 0` replays the whole trace, about 1,000 s per router; a trace cut to
a minute holds little of its reuse). Figures per router:
goodput, TTFT p50/p90/p99, E2E, throughput and the engines' own prefix-cache hit rate
(`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` summed over the fleet's /metrics).
Run it under `flock /tmp/berth-heavy.lock` on a shared machine. Output: DIR/report.md, DIR/report.json and
per router DIR/live/ROUTER/ (its command's log, the fleet's log, loadgen.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from gateway.telemetry.promtext import parse
from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import say
from loadgen.bench.scheduling.live_stack import STOP_GRACE_S, start_fleet, start_gateway
from loadgen.bench.scheduling.prefix_report import figures
from loadgen.bench.scheduling.prefix_setup import (
    MODEL,
    PROFILE,
    WORKLOADS,
    fleet_file,
    gateway_toml,
    load_for,
    policy_text,
    schedule,
    trace_path,
    workload_arg,
    workload_options,
)
from loadgen.bench.skeleton import run_bench
from loadgen.harness import REPO_ROOT, ManagedProcess, free_port, http_get
from loadgen.runner import RunOptions, run_workload

PEER_CACHE: Final = Path(os.environ.get("BERTH_PEER_CACHE", "~/.cache/berth/peers")).expanduser()
READY_TIMEOUT_S: Final = 60.0
LIVE_DURATION_S: Final = 60.0
LIVE_LOAD: Final = 1.0
#: The trace shows its reuse only over its whole length (about 1,000 s at load 1: `--workloads mooncake
#: --duration 0`); a one-minute run of coding sessions shows theirs.
LIVE_WORKLOAD: Final = "coding"
LIVE_ENDPOINTS: Final = 4
DRAIN_S: Final = 60.0
#: The engines' profile (the simulator's; a test swaps in a faster one to check the plumbing).
LIVE_PROFILE = PROFILE


@dataclass(frozen=True, slots=True)
class Peer:
    package: str  # pip requirement
    venv: str  # directory under PEER_CACHE
    argv: tuple[str, ...]  # after the venv's bin/: {port}, {aux} and {policy} filled in, worker URLs appended
    policy: str
    env: tuple[tuple[str, str], ...] = ()


PEERS: Final[dict[str, Peer]] = {
    "vllm-router-cache_aware": Peer(
        "vllm-router==0.1.17", "vllm-router-0.1.17",
        ("vllm-router", "--host", "127.0.0.1", "--port", "{port}", "--policy", "{policy}",
         "--log-level", "warning", "--prometheus-port", "{aux}", "--worker-urls"),
        "cache_aware",
    ),
    "vllm-router-power_of_two": Peer(
        "vllm-router==0.1.17", "vllm-router-0.1.17",
        ("vllm-router", "--host", "127.0.0.1", "--port", "{port}", "--policy", "{policy}",
         "--log-level", "warning", "--prometheus-port", "{aux}", "--worker-urls"),
        "power_of_two",
    ),
    "sglang-router-cache_aware": Peer(
        "sglang-router==0.3.2", "sglang-router-0.3.2",
        ("python", "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", "{port}",
         "--policy", "{policy}", "--log-level", "warn", "--prometheus-port", "{aux}", "--worker-urls"),
        "cache_aware", (("HF_HUB_OFFLINE", "1"),),
    ),
}  # fmt: skip
ROUTERS: Final = ("berth", "berth-precise", *PEERS)


def free_ports(n: int) -> int:
    """The first of `n` consecutive TCP ports on 127.0.0.1 that nothing listens on at the moment."""
    for _ in range(50):
        first = free_port()
        socks: list[socket.socket] = []
        try:
            for k in range(n):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind(("127.0.0.1", first + k))
            return first
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def live_fleet(endpoints: int, events_port: int) -> str:
    """The fleet file of every live run: the benchmark's, each engine publishing its KV events."""
    return fleet_file(endpoints, LIVE_PROFILE) + f'kv_events = "tcp://127.0.0.1:{events_port}"\n'


def ensure_peer(peer: Peer, log: Path) -> Path:
    """The peer's virtualenv, made and installed on first use; raises RuntimeError saying why not."""
    venv = PEER_CACHE / peer.venv
    marker = venv / ".installed"
    if marker.exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        for argv in (
            [sys.executable, "-m", "venv", str(venv)],
            [str(venv / "bin" / "pip"), "install", "-q", peer.package],
        ):
            if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False).returncode:
                raise RuntimeError(f"{' '.join(argv)} failed (see {log})")
    marker.write_text(peer.package + "\n")
    return venv


def peer_argv(peer: Peer, venv: Path, port: int, aux: int, urls: Sequence[str]) -> list[str]:
    fill = {"port": str(port), "aux": str(aux), "policy": peer.policy}
    argv = [a.format(**fill) for a in peer.argv]
    return [str(venv / "bin" / argv[0]), *argv[1:], *urls]


def start_peer(peer: Peer, venv: Path, urls: Sequence[str], log_path: Path) -> tuple[ManagedProcess, str]:
    port, aux = free_port(), free_port()
    env = {**os.environ, **dict(peer.env)}
    proc = ManagedProcess(peer.venv, peer_argv(peer, venv, port, aux, urls), log_path=log_path, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        proc.poll_until(f"{base}/health", lambda: http_get(base + "/health")[0] == 200, READY_TIMEOUT_S)
    except BaseException:
        proc.stop(STOP_GRACE_S)
        raise
    return proc, base


async def engine_hits(urls: Sequence[str]) -> tuple[float, float] | None:
    """(hit tokens, queried tokens) summed over the engines' vLLM prefix-cache counters."""
    hits = queries = 0.0
    async with aiohttp.ClientSession() as s:
        for url in urls:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with s.get(url + "/metrics") as r:
                    page = parse((await r.read()).decode())
                hits += page.value("vllm:prefix_cache_hits_total") or 0.0
                queries += page.value("vllm:prefix_cache_queries_total") or 0.0
    return (hits, queries) if queries else None


async def prefix_sources(base: str) -> dict[str, int] | None:
    """berth's prefix index source per endpoint at the end of a run (/admin/fleet), counted by kind."""
    with contextlib.suppress(aiohttp.ClientError, OSError, ValueError):
        async with aiohttp.ClientSession() as s, s.get(base + "/admin/fleet") as r:
            doc = orjson.loads(await r.read())
        out: dict[str, int] = {}
        for ep in doc.get("endpoints") or []:
            kind = str((ep.get("prefix") or {}).get("source"))
            out[kind] = out.get(kind, 0) + 1
        return out
    return None


def berth_gateway(urls: Sequence[str], port: int, policy: Path, events_port: int | None = None) -> str:
    """berth's configuration; with `events_port`, the precise source (endpoint i's events at
    events_port + i, token ids from the engines' /tokenize)."""
    tuned = gateway_toml(day_one=False)
    if events_port is not None:
        tuned = tuned.replace("[telemetry]\n", '[telemetry]\nprompt_tokens = "tokenize"\n')
        tuned = tuned.replace("[prefix]\n", '[prefix]\nsource = "precise"\n')
    lines = [
        "[server]",
        f'listen = "127.0.0.1:{port}"',
        'log_level = "warning"',
        "drain_timeout_s = 2.0",
        tuned,
        "[policy]",
        f"file = {orjson.dumps(str(policy)).decode()}",
        "",
    ]
    for i, url in enumerate(urls):
        lines += [
            "[[endpoints]]",
            f'url = "{url}"',
            f'id = "e{i:02d}"',
            'engine = "vllm"',
            f'models = ["{MODEL}"]',
        ]
        if events_port is not None:
            lines.append(f'kv_events = "tcp://127.0.0.1:{events_port + i}"')
        lines.append("")
    return "\n".join(lines)


async def run_router(router: str, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One router's live run; {"router", "error"} when it could not be installed or started."""
    d = out / "live" / router
    d.mkdir(parents=True, exist_ok=True)
    workload, trace = a.workload, trace_path(a.trace)
    fleet = d / "fleet.toml"
    events_port = free_ports(a.endpoints)
    fleet.write_text(live_fleet(a.endpoints, events_port))
    at = load_for(workload, trace, a.load, a.duration, a.endpoints)
    tasks = schedule(workload, trace, at, a.duration, a.seed, cut=a.duration > 0)
    venv: Path | None = None
    if router not in {"berth", "berth-precise"}:
        try:
            venv = await asyncio.to_thread(ensure_peer, PEERS[router], d / "install.log")
        except RuntimeError as e:
            return {"router": router, "error": f"not installed: {e}"}
    procs: list[ManagedProcess] = []
    t0 = time.perf_counter()
    try:
        sim, urls = await asyncio.to_thread(start_fleet, fleet, a.endpoints, d / "sim.log")
        procs.append(sim)
        if venv is None:
            policy = d / "policy.toml"
            policy.write_text(policy_text(workload, "berth"))
            port = free_port()
            precise = events_port if router == "berth-precise" else None
            (d / "gateway.toml").write_text(berth_gateway(urls, port, policy, precise))
            base = f"http://127.0.0.1:{port}"
            procs.append(
                await asyncio.to_thread(
                    start_gateway, d / "gateway.toml", base, a.endpoints, d / "router.log"
                )
            )
        else:
            proc, base = await asyncio.to_thread(start_peer, PEERS[router], venv, urls, d / "router.log")
            procs.append(proc)
        opts = RunOptions(
            target=base, workload=workload_arg(workload, trace), rate=at.rate, duration_s=a.duration,
            seed=a.seed, models=(MODEL,), slo_headers=True, request_timeout_s=DRAIN_S + a.duration,
            stall_timeout_s=DRAIN_S, drain_timeout_s=DRAIN_S,
            workload_options=workload_options(workload, time_scale=at.time_scale),
            watch_pids={"router": procs[-1].pid, "sim": sim.pid},
        )  # fmt: skip
        report = await run_workload(opts, schedule=tasks)
        report.write(d / "loadgen.json")
        counted = await engine_hits(urls)
        sources = await prefix_sources(base) if venv is None else None
    except Exception as e:  # a peer that does not start, or dies: reported, the others still run
        return {"router": router, "error": f"{type(e).__name__}: {e}"}
    finally:
        for proc in reversed(procs):
            await asyncio.to_thread(proc.stop, STOP_GRACE_S)
    run: dict[str, Any] = {"router": router, "load": a.load, "seed": a.seed, **figures(report)}
    if sources is not None:
        run["prefix_sources"] = sources  # which source answered for each endpoint at the end
    if counted is not None:
        run["hit_tokens"], run["queried_tokens"] = counted
        run["hit_rate"] = round(counted[0] / counted[1], 4)
    run["wall_s"] = round(time.perf_counter() - t0, 1)
    return run


def live_markdown(runs: Sequence[dict[str, Any]], a: argparse.Namespace) -> str:
    out = [
        "# Prefix-cache benchmark, live",
        "",
        f"`{a.workload}` at load {a.load:g}, seed {a.seed}, {a.duration:g} s of arrivals, {a.endpoints} "
        "engines of the engine simulator with prefix caching, a fresh fleet per router.",
        "",
        "| router | goodput | TTFT p50 ms | p90 | p99 | E2E p50 ms | out tok/s | engine hit rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "error" in r:
            first = str(r["error"]).splitlines()[0].replace("|", "/")
            out.append(f"| {r['router']} | did not run: {first} | | | | | | |")
            continue
        cells = [r.get(k) for k in ("goodput", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "e2e_p50_ms",
                                    "output_tokens_per_s", "hit_rate")]  # fmt: skip
        out.append(f"| {r['router']} | " + " | ".join("n/a" if c is None else f"{c}" for c in cells) + " |")
    return "\n".join([*out, ""])


def main_live(a: argparse.Namespace) -> int:
    routers = tuple(x for x in (a.routers or ",".join(ROUTERS)).split(",") if x)
    unknown = [r for r in routers if r not in ROUTERS]
    if unknown:
        known = ", ".join(ROUTERS)
        print(
            f"berth-loadgen bench prefix: unknown routers {', '.join(unknown)}; known: {known}",
            file=sys.stderr,
        )
        return 2
    a.workload = (a.workloads or LIVE_WORKLOAD).split(",")[0]
    if a.workload not in WORKLOADS:
        print(f"berth-loadgen bench prefix: unknown workload {a.workload}", file=sys.stderr)
        return 2
    a.load = float((a.loads or str(LIVE_LOAD)).split(",")[0])
    a.seed = 0
    a.duration = a.duration if a.duration is not None else LIVE_DURATION_S
    a.endpoints = a.endpoints if a.endpoints is not None else LIVE_ENDPOINTS
    a.out.mkdir(parents=True, exist_ok=True)

    def run(a: argparse.Namespace) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = []
        for router in routers:
            r = asyncio.run(run_router(router, a, a.out))
            runs.append(r)
            say(
                f"{router}: {r.get('error') or {k: r.get(k) for k in ('goodput', 'ttft_p90_ms', 'hit_rate')}}"
            )
        say(live_markdown(runs, a))
        return runs

    # The live run confirms the simulated comparison's figures; its targets are judged there.
    return run_bench(
        BENCHMARKS["prefix"], a, run, report=lambda runs: ({"runs": runs}, live_markdown(runs, a))
    )


__all__ = ["PEERS", "REPO_ROOT", "ROUTERS", "main_live", "run_router"]
