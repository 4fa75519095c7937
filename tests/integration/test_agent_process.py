"""berth-agent's process backend for real: the CLI as a subprocess starting `berth-engine-sim` engines.

Every command is a new `python -m gateway.agent` process, so each one re-adopts what the last one left
(the engines outlive the CLI that started them). Waits on other processes are bounded polls
(`poll_until`); nothing sleeps for a fixed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.agent import procs
from gateway.agent.contract import ErrorReport, ListReport, PlanReport, StartReport, StopReport
from gateway.agent.state import StateDir
from gateway.agent.wait import poll_until
from tests.integration.agent_engines import kill_engines, sim_command

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30

SIM = sim_command(0.3)
# The engine with a helper process that ignores SIGTERM (like a vLLM worker that outlives its server):
# only the whole group, SIGKILLed after the drain timeout, ends it.
SIM_WITH_WORKER = [
    "sh",
    "-c",
    "(trap '' TERM; exec sleep 600) & exec \"$0\" -m loadgen.engine_sim.cli --model {model} --port {port}"
    " --load-time-s 0.3",
    sys.executable,
]


def _model(name: str, command: list[str], memory_gib: float, extra: str = "") -> str:
    return (
        f'[[models]]\nname = "{name}"\nengine = "vllm"\ncommand = {json.dumps(command)}\n'
        f"memory_gib = {memory_gib}\nload_timeout_s = 60\n{extra}"
    )


@dataclass
class AgentCli:
    config: Path
    state: StateDir

    def run(self, *argv: str) -> tuple[int, Any]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        p = subprocess.run(
            [sys.executable, "-m", "gateway.agent", "-c", str(self.config), *argv],
            capture_output=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert p.stdout.count(b"\n") == 1, (p.stdout, p.stderr)
        return p.returncode, p.stdout

    def ok(self, type_: type[Any], *argv: str) -> Any:
        status, out = self.run(*argv)
        assert status == 0, out
        return msgspec.json.decode(out, type=type_)

    def spawn(self, *argv: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        return subprocess.Popen(
            [sys.executable, "-m", "gateway.agent", "-c", str(self.config), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )

    def error(self, *argv: str) -> Any:
        status, out = self.run(*argv)
        assert status == 1, out
        return msgspec.json.decode(out, type=ErrorReport).error


@pytest.fixture
def agent(tmp_path: Path, agent_ports: tuple[int, int]) -> Iterator[AgentCli]:
    models = "\n".join(
        [
            _model("sim-a", SIM_WITH_WORKER, 4),
            _model("sim-b", SIM, 4),
            _model("crash", ["sh", "-c", "echo boom >&2; exit 3"], 1, 'env = { PORT = "{port}" }\n'),
            _model("hang", ["sleep", "600"], 1, 'stall_timeout_s = 1\nenv = { PORT = "{port}" }\n'),
            # Two instance configurations; the engine simulator takes the max batch as --max-num-seqs.
            _model(
                "sim-c",
                [*SIM, "--max-num-seqs", "{max_batch}"],
                1,
                'default_config = "b8"\n[[models.configs]]\nname = "b2"\nmax_batch = 2\n'
                '[[models.configs]]\nname = "b8"\nmax_batch = 8\n',
            ),
            # Its health answers 503 for a minute: a load that is still going when the test looks.
            _model("sim-slow", [*SIM[:-1], "60"], 1),
        ]
    )
    (tmp_path / "models.toml").write_text(models)
    (tmp_path / "agent.toml").write_text(
        f'state_dir = "state"\nnvml = false\nheadroom_gib = 1\nrelease_wait_s = 0.2\nstop_timeout_s = 1\n'
        f"port_range = [{agent_ports[0]}, {agent_ports[1]}]\n"
        '[[devices]]\nname = "gpu0"\nmemory_gib = 7\n'  # capacity 6 GiB: one 4 GiB model at a time
    )
    cli = AgentCli(tmp_path / "agent.toml", StateDir(tmp_path / "state"))
    yield cli
    kill_engines(cli.state)  # whatever a failing test left running


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def test_start_health_list_stop(agent: AgentCli) -> None:
    started = agent.ok(StartReport, "start", "sim-a", "--id", "a1")
    inst = started.instance
    assert (inst.id, inst.state, inst.devices, inst.memory_bytes) == ("a1", "ready", ["gpu0"], 4 * GIB)
    assert started.load_s > 0
    assert _answers(inst.url + "/health")
    assert inst.pid is not None
    group = procs.group_members(inst.pid)
    assert len(group) == 2  # the engine and its worker, in their own group

    # A new invocation (an agent "restart") re-adopts the engine its predecessor started.
    listed = agent.ok(ListReport, "list")
    assert [(i.id, i.state, i.healthy, i.pid) for i in listed.instances] == [("a1", "ready", True, inst.pid)]

    stopped = agent.ok(StopReport, "stop", "a1", "--drain-timeout", "0.5")
    assert (stopped.state, stopped.was, stopped.killed) == (
        "stopped",
        "ready",
        True,
    )  # the worker needed SIGKILL
    assert procs.group_members(inst.pid) == []
    assert all(procs.stat(pid) is None or procs.stat(pid).gone for pid in group)  # type: ignore[union-attr]
    assert not _answers(inst.url + "/health")
    (listed_after,) = agent.ok(ListReport, "list").instances
    assert (listed_after.state, listed_after.reason) == ("stopped", "stopped")


def test_a_start_that_does_not_fit_then_a_swap_with_evict(agent: AgentCli) -> None:
    a = agent.ok(StartReport, "start", "sim-a", "--id", "a1").instance
    err = agent.error("start", "sim-b")
    assert err.code == "insufficient_memory"
    (fit,) = err.devices
    assert (fit.capacity_bytes, fit.reserved_bytes, fit.required_bytes) == (6 * GIB, 4 * GIB, 4 * GIB)

    plan = agent.ok(PlanReport, "plan", "sim-b")
    assert (plan.fits, plan.evict) == (False, ["a1"])

    swapped = agent.ok(StartReport, "start", "sim-b", "--id", "b1", "--evict", "a1")
    assert [(e.id, e.state) for e in swapped.evicted] == [("a1", "stopped")]
    assert procs.group_members(a.pid) == []
    assert _answers(swapped.instance.url + "/health")
    listed = {i.id: i.state for i in agent.ok(ListReport, "list").instances}
    assert listed == {"a1": "stopped", "b1": "ready"}
    agent.ok(StopReport, "stop", "b1")


def test_an_engine_that_exits_during_its_load_is_a_failed_start(agent: AgentCli) -> None:
    err = agent.error("start", "crash", "--id", "c1")
    assert err.code == "engine_exited"
    assert "status 3" in err.message
    assert "boom" in err.log_tail
    (inst,) = agent.ok(ListReport, "list").instances
    assert (inst.state, inst.reason) == ("failed", err.message)
    node_free = agent.ok(PlanReport, "plan", "sim-a")
    assert node_free.fits  # nothing stays booked for it


def test_a_stalled_load_is_failed_and_ended(agent: AgentCli) -> None:
    err = agent.error("start", "hang", "--id", "h1")
    assert err.code == "load_stalled"
    rec = agent.state.read("h1")
    assert rec is not None
    assert rec.pid is not None
    assert procs.group_members(rec.pid) == []


def test_an_engine_killed_behind_the_agents_back_is_marked_failed(agent: AgentCli) -> None:
    inst = agent.ok(StartReport, "start", "sim-b", "--id", "b1").instance
    os.kill(inst.pid, signal.SIGKILL)
    assert poll_until(lambda: procs.group_members(inst.pid) == [], 10)
    (listed,) = agent.ok(ListReport, "list").instances
    assert (listed.state, listed.reason) == ("failed", "engine exited after it was ready")
    assert agent.ok(PlanReport, "plan", "sim-a").fits


def test_one_load_per_device_and_a_stop_during_a_load(agent: AgentCli) -> None:
    loading = agent.spawn("start", "sim-slow", "--id", "s1")
    try:

        def launched() -> bool:
            rec = agent.state.read("s1")
            return rec is not None and rec.pid is not None

        assert poll_until(launched, 30)
        # The node lock is free during the load: list answers, and shows it starting.
        (inst,) = agent.ok(ListReport, "list").instances
        assert inst.state == "starting"
        # A second load on the same device waits for none: it is refused, naming the load in progress.
        err = agent.error("start", "sim-b")
        assert (err.code, err.loading) == ("device_busy", "s1")
        # A stop during the load takes the instance over; the start reports the load cancelled.
        stopped = agent.ok(StopReport, "stop", "s1", "--drain-timeout", "2")
        assert (stopped.state, stopped.was) == ("stopped", "starting")
        out, _ = loading.communicate(timeout=60)
    finally:
        if loading.poll() is None:
            loading.kill()
            loading.wait()
    assert loading.returncode == 1
    assert msgspec.json.decode(out, type=ErrorReport).error.code == "load_cancelled"
    (inst,) = agent.ok(ListReport, "list").instances
    assert inst.state == "stopped"
    assert procs.group_members(inst.pid or 0) == []


def test_start_and_plan_an_instance_configuration(agent: AgentCli) -> None:
    plan = agent.ok(PlanReport, "plan", "sim-c", "--config", "b2")
    assert (plan.fits, plan.config) == (True, "b2")
    assert agent.ok(PlanReport, "plan", "sim-c").config == "b8"
    small = agent.ok(StartReport, "start", "sim-c", "--config", "b2", "--id", "c2").instance
    assert (small.config, small.max_batch) == ("b2", 2)
    default = agent.ok(StartReport, "start", "sim-c", "--id", "c8").instance
    assert (default.config, default.max_batch) == ("b8", 8)
    # The engine runs with the configuration's batch (the simulator's /sim/state says so).
    for inst, seqs in ((small, 2), (default, 8)):
        with urllib.request.urlopen(inst.url + "/sim/state", timeout=5) as r:
            assert json.loads(r.read())["config"]["max_num_seqs"] == seqs
    listed = {i.id: i.config for i in agent.ok(ListReport, "list").instances}
    assert listed == {"c2": "b2", "c8": "b8"}
    err = agent.error("start", "sim-c", "--config", "b64")
    assert (err.code, err.model) == ("unknown_config", "sim-c")
    assert "known: b2, b8" in err.message
    agent.ok(StopReport, "stop", "c2")
    agent.ok(StopReport, "stop", "c8")
