"""The live path of the benchmarks that confirm a simulated comparison over HTTP (`bench scheduling
--live`, `bench classes --live`): a simulated fleet (`berth-engine-sim --fleet FILE`) and berth (`berth
serve`) as processes, started in that order and stopped in the reverse one (berth's drain needs the
engines), berth's counters read from its /metrics, and the check that makes a run valid.

    async with live_processes(run_dir, fleet_path, n, gateway_for) as live:
        ...                       # drive live.base with the loadgen runner (watch_pids=live.watch_pids)
        page = await berth_metrics(live.base)
        runqueue = live.runqueue_shares(wall_s)
    cpu, valid, notes = cpu_validity(report.data, runqueue)

Validity: a run is valid only when neither berth nor loadgen was CPU-starved: each used at most
`CPU_FLAG_THRESHOLD` of a core (loadgen's CPU report) and spent at most `RUNQUEUE_LIMIT` of the run
waiting for a CPU while runnable (`/proc/PID/task/*/schedstat`: other processes on a shared machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from gateway.telemetry.promtext import Exposition, parse
from loadgen.cpu import CPU_FLAG_THRESHOLD, runqueue_wait_s
from loadgen.harness import REPO_ROOT, ManagedProcess, free_port, http_get, start_engine_sim

RUNQUEUE_LIMIT: Final = 0.10  # share of the run a process may wait for a CPU before it counts as starved
READY_TIMEOUT_S: Final = 60.0  # for berth to see every endpoint ready
STOP_GRACE_S: Final = 10.0
#: The processes whose CPU the validity check judges (the engine simulator's is reported, not judged:
#: a starved simulator slows the engines, which the figures show).
JUDGED: Final = ("berth", "loadgen")


def fleet_ready(base: str, n: int) -> bool:
    """Whether berth's /admin/fleet shows all `n` endpoints ready."""
    status, body = http_get(base + "/admin/fleet")
    if status != 200:
        return False
    eps = orjson.loads(body).get("endpoints") or []
    return len(eps) == n and all(e.get("ready") for e in eps)


def start_gateway(config: Path, base: str, n: int, log_path: Path) -> ManagedProcess:
    """berth serving `config` at `base`, once it sees all `n` endpoints ready."""
    argv = [sys.executable, "-m", "gateway.cli", "serve", "-c", str(config)]
    proc = ManagedProcess("berth", argv, log_path=log_path, cwd=REPO_ROOT)
    try:
        what = f"all {n} endpoints ready on {base}/admin/fleet"
        proc.poll_until(what, lambda: fleet_ready(base, n), READY_TIMEOUT_S)
    except BaseException:
        proc.stop(STOP_GRACE_S)
        raise
    return proc


def start_fleet(fleet_path: Path, n: int, log_path: Path) -> tuple[ManagedProcess, list[str]]:
    """The simulated fleet of `fleet_path` in a process of its own, and its `n` endpoints' URLs (in the
    file's order) once it serves them."""
    args = ["--fleet", str(fleet_path), "--port", "0"]
    return start_engine_sim(args, log_path, endpoints=n, cwd=REPO_ROOT)


@dataclass(slots=True)
class LiveProcesses:
    """The engine simulator and berth of one run, and where each process's run-queue wait stood when the
    measured part of the run began (`mark`)."""

    sim: ManagedProcess
    berth: ManagedProcess
    urls: list[str]  # the endpoints', in the fleet file's order
    base: str  # berth's, http://127.0.0.1:PORT
    runqueue_at_mark: dict[str, float] = field(default_factory=dict)

    @property
    def watch_pids(self) -> dict[str, int]:
        """For the loadgen runner's CPU report (`RunOptions.watch_pids`); loadgen reports itself."""
        return {"berth": self.berth.pid, "sim": self.sim.pid}

    def _pids(self) -> dict[str, int]:
        return {**self.watch_pids, "loadgen": os.getpid()}

    def mark(self) -> None:
        """The measured part of the run begins now."""
        self.runqueue_at_mark = {k: runqueue_wait_s(p) for k, p in self._pids().items()}

    def runqueue_shares(self, wall_s: float) -> dict[str, float]:
        """Per process, the share of the `wall_s` since `mark` it spent runnable but waiting for a CPU."""
        if wall_s <= 0:
            return dict.fromkeys(self._pids(), 0.0)
        return {
            k: (runqueue_wait_s(p) - self.runqueue_at_mark.get(k, 0.0)) / wall_s
            for k, p in self._pids().items()
        }


@contextlib.asynccontextmanager
async def live_processes(
    run_dir: Path, fleet_path: Path, n: int, gateway_for: Callable[[Sequence[str], int], str]
) -> AsyncIterator[LiveProcesses]:
    """The fleet of `fleet_path` (`n` endpoints), then berth on a free port with the configuration
    `gateway_for(urls, port)` (written to run_dir/gateway.toml), both ready; stopped on exit (berth
    first). Their output goes to run_dir/sim.log and run_dir/berth.log. Marked as the block begins."""
    procs: list[ManagedProcess] = []
    try:
        sim, urls = await asyncio.to_thread(start_fleet, fleet_path, n, run_dir / "sim.log")
        procs.append(sim)
        port = free_port()
        gw = run_dir / "gateway.toml"
        gw.write_text(gateway_for(urls, port))
        base = f"http://127.0.0.1:{port}"
        berth = await asyncio.to_thread(start_gateway, gw, base, n, run_dir / "berth.log")
        procs.append(berth)
        live = LiveProcesses(sim, berth, urls, base)
        live.mark()
        yield live
    finally:
        for proc in reversed(procs):  # berth first: its drain needs the engines
            await asyncio.to_thread(proc.stop, STOP_GRACE_S)


async def berth_metrics(base: str) -> Exposition | None:
    """berth's /metrics page, parsed; None when it could not be read."""
    with contextlib.suppress(aiohttp.ClientError, OSError):
        async with aiohttp.ClientSession() as s, s.get(base + "/metrics") as r:
            return parse((await r.read()).decode())
    return None


def counter_total(page: Exposition | None, name: str) -> int:
    """The sum of counter `name` (its `_total` samples) over every label set; -1 without a page."""
    if page is None:
        return -1
    return round(page.value(name + "_total") or 0.0)


def cpu_validity(
    data: Mapping[str, Any], runqueue: Mapping[str, float]
) -> tuple[dict[str, dict[str, Any]], bool, list[str]]:
    """(per process: cpu_share and runqueue_share; whether the run is valid; why not) from a loadgen
    report's `data` (its CPU report) and `runqueue` (`LiveProcesses.runqueue_shares`)."""
    shares = data.get("cpu", {}).get("processes", {})
    cpu: dict[str, dict[str, Any]] = {}
    for name in ("berth", "loadgen", "sim"):
        cpu[name] = {
            "cpu_share": shares.get(name, {}).get("cpu_share"),
            "runqueue_share": round(runqueue.get(name, 0.0), 4),
        }
    notes: list[str] = []
    for name in JUDGED:
        share = cpu[name]["cpu_share"]
        if share is not None and share > CPU_FLAG_THRESHOLD:
            notes.append(f"{name} used {share * 100:.0f} % of a core (> {CPU_FLAG_THRESHOLD * 100:.0f} %)")
        if cpu[name]["runqueue_share"] > RUNQUEUE_LIMIT:
            notes.append(
                f"{name} waited for a CPU {cpu[name]['runqueue_share'] * 100:.0f} % of the run "
                f"(> {RUNQUEUE_LIMIT * 100:.0f} %)"
            )
    return cpu, not notes, notes
