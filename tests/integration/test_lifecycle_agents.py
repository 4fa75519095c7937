"""berth in front of a node agent (the process backend) that starts `berth-engine-sim` engines on demand.

Real processes throughout: `berth serve -c gateway.toml` with `[lifecycle]` and one `[[nodes]]` whose agent
command is `python -m gateway.agent -c agent.toml`; the agent starts simulated engines (each health answers
503 for `--load-time-s` first). The node's one device holds one model at a time. Waits are bounded polls.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.agent import procs
from gateway.agent.state import StateDir
from loadgen.harness import REPO_ROOT, RunningServer, free_port, start_server
from tests.integration.agent_engines import kill_engines, sim_command

SIM = sim_command(0.5)


def _model(name: str, command: list[str], memory_gib: float) -> str:
    return (
        f'[[models]]\nname = "{name}"\nengine = "vllm"\ncommand = {json.dumps(command)}\n'
        f"memory_gib = {memory_gib}\nload_timeout_s = 60\n"
    )


@dataclass
class Setup:
    dir: Path
    gateway_toml: Path
    state: StateDir

    def start(self, name: str = "berth") -> RunningServer:
        port = free_port()
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO_ROOT))
        return start_server(
            name,
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                "-c",
                str(self.gateway_toml),
                "--listen",
                f"127.0.0.1:{port}",
                "--batch-dir",
                str(self.dir / f"{name}-batch"),
            ],
            port=port,
            log_path=self.dir / f"{name}.log",
            ready_path="/readyz",
            timeout_s=60,
            env=env,
            cwd=REPO_ROOT,
        )


@pytest.fixture
def setup(tmp_path: Path, agent_ports: tuple[int, int]) -> Iterator[Setup]:
    (tmp_path / "models.toml").write_text(
        "\n".join(
            [
                _model("sim-a", SIM, 4),
                # Instance configurations: the default one runs the engine with --max-num-seqs 2.
                _model("sim-b", [*SIM, "--max-num-seqs", "{max_batch}"], 4)
                + 'default_config = "b2"\n[[models.configs]]\nname = "b2"\nmax_batch = 2\n'
                '[[models.configs]]\nname = "b16"\nmax_batch = 16\n',
                _model("crash", ["sh", "-c", "echo boom >&2; exit 3", "{port}"], 1),
            ]
        )
    )
    (tmp_path / "agent.toml").write_text(
        'models = "models.toml"\nstate_dir = "state"\nnvml = false\nheadroom_gib = 1\nrelease_wait_s = 0.2\n'
        f"stop_timeout_s = 2\nport_range = [{agent_ports[0]}, {agent_ports[1]}]\n"
        '[[devices]]\nname = "gpu0"\nmemory_gib = 7\n'  # capacity 6 GiB: one 4 GiB model at a time
    )
    agent = json.dumps([sys.executable, "-m", "gateway.agent", "-c", str(tmp_path / "agent.toml")])
    (tmp_path / "gateway.toml").write_text(
        "[lifecycle]\n"
        'models = "models.toml"\n'
        "load_deadline_s = 60\nchurn_guard_s = 0\ndrain_timeout_s = 2\nrefresh_interval_s = 0.5\n"
        '[lifecycle.evictor]\nplugin = "lru"\n'
        f'[[nodes]]\nname = "n1"\nagent = {agent}\n'
        "[scrape]\ninterval_s = 0.2\nstale_after_s = 1\n"
    )
    s = Setup(tmp_path, tmp_path / "gateway.toml", StateDir(tmp_path / "state"))
    yield s
    kill_engines(s.state)  # the engines outlive berth and the agent: end whatever is left


def complete(berth: RunningServer, model: str) -> tuple[int, dict[str, Any]]:
    body = {"model": model, "prompt": "hello", "max_tokens": 4}
    req = urllib.request.Request(
        berth.base_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=90) as r:
            return int(r.status), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def fleet(berth: RunningServer) -> dict[str, Any]:
    status, body = berth.get("/admin/fleet")
    assert status == 200
    doc: dict[str, Any] = json.loads(body)["lifecycle"]
    return doc


def metric(berth: RunningServer, line_start: str) -> float:
    for line in berth.metrics().splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def states(berth: RunningServer) -> dict[str, str]:
    return {i["id"]: i["state"] for i in fleet(berth)["instances"]}


def test_cold_start_concurrent_join_swap_and_failed_load(setup: Setup) -> None:
    berth = setup.start()
    try:
        assert fleet(berth)["instances"] == []  # an empty fleet, ready because the agent answered
        # Three concurrent requests for a model nobody runs: one load, all served from it.
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda _: complete(berth, "sim-a"), range(3)))
        assert [s for s, _ in results] == [200, 200, 200], results
        assert metric(berth, 'berth_lifecycle_loads_total{model="sim-a",result="ok"}') == 1
        assert list(states(berth).values()) == ["ready"]
        assert metric(berth, 'berth_lifecycle_cold_start_wait_seconds_count{model="sim-a"}') == 1

        # sim-b does not fit beside sim-a: sim-a is drained and stopped, sim-b loaded and served.
        status, _ = complete(berth, "sim-b")
        assert status == 200
        by_model = {i["model"]: i for i in fleet(berth)["instances"]}
        assert by_model["sim-b"]["state"] == "ready"
        assert by_model["sim-a"]["state"] == "stopped"
        # The endpoint knows its configuration's max batch, and berth's cap holds to it.
        status, raw = berth.get("/admin/fleet")
        (ep_b,) = [e for e in json.loads(raw)["endpoints"] if "sim-b" in e["models"]]
        assert (ep_b["config"], ep_b["max_batch"], ep_b["cap"]) == ("b2", 2, 2)
        assert metric(berth, 'berth_lifecycle_evictions_total{reason="evicted"}') == 1
        (a_rec,) = [r for r in setup.state.records() if r.model == "sim-a"]
        assert a_rec.pid is not None
        assert (
            procs.group_members(a_rec.pid, since_ticks=a_rec.pid_start or 0) == []
        )  # its processes are gone

        # A load that fails: the waiting request gets 503 model_load_failed with the agent's reason.
        status, body = complete(berth, "crash")
        assert status == 503
        assert body["error"]["code"] == "model_load_failed"
        assert "engine_exited" in body["error"]["message"]
        assert metric(berth, 'berth_lifecycle_loads_total{model="crash",result="failed"}') == 1
        # ... and nothing leaks: sim-b still serves, nothing waits.
        assert complete(berth, "sim-b")[0] == 200
        assert fleet(berth)["waiting_loads"] == {}
    finally:
        berth.process.stop()


def test_restart_readopts_running_engines_and_a_crash_reloads(setup: Setup) -> None:
    berth = setup.start("berth-1")
    try:
        assert complete(berth, "sim-a")[0] == 200
    finally:
        berth.process.stop()
    # The engine outlives berth; a new berth re-adopts it through the agent's list, without a load.
    berth = setup.start("berth-2")
    try:
        berth.process.poll_until("sim-a adopted", lambda: "ready" in states(berth).values(), 30)
        assert complete(berth, "sim-a")[0] == 200
        assert metric(berth, 'berth_lifecycle_loads_total{model="sim-a",result="ok"}') == 0

        # The engine crashes: the agent's list shows it, it leaves the endpoint set, the next request reloads.
        (rec,) = [r for r in setup.state.records() if r.model == "sim-a"]
        assert rec.pid is not None
        os.killpg(rec.pid, signal.SIGKILL)
        berth.process.poll_until(
            "crash noticed",
            lambda: metric(berth, 'berth_lifecycle_evictions_total{reason="crashed"}') == 1,
            30,
        )
        assert complete(berth, "sim-a")[0] == 200
        assert metric(berth, 'berth_lifecycle_loads_total{model="sim-a",result="ok"}') == 1
    finally:
        berth.process.stop()
