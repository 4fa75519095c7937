"""Two `berth serve` processes in cluster mode (a real redis-server) in front of one node agent that
starts simulated engines: a cold start asked on the follower is carried out by the leader, the leader
killed with SIGKILL is replaced within its lease, and its late agent command (an older fencing token) is
refused by the agent. Waits on other processes are bounded polls, as in the lifecycle tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.agent.state import StateDir
from loadgen.harness import REPO_ROOT, RunningServer, free_port, start_server
from tests.integration.agent_engines import kill_engines
from tests.integration.redis_server import RedisServer
from tests.integration.test_lifecycle_agents import SIM, _model, complete, metric

AGENT = [sys.executable, "-m", "gateway.agent"]


@dataclass
class Cluster2:
    dir: Path
    state: StateDir
    redis: str
    prefix: str

    def toml(self, name: str) -> Path:
        agent = json.dumps([*AGENT, "-c", str(self.dir / "agent.toml")])
        p = self.dir / f"{name}.toml"
        p.write_text(
            f'[cluster]\nredis = "{self.redis}"\nname = "{name}"\nkey_prefix = "{self.prefix}"\n'
            "lease_s = 1.0\npublish_interval_s = 0.1\n"
            "[lifecycle]\n"
            'models = "models.toml"\n'
            "load_deadline_s = 60\nchurn_guard_s = 0\ndrain_timeout_s = 2\nrefresh_interval_s = 0.5\n"
            '[lifecycle.evictor]\nplugin = "lru"\n'
            f'[[nodes]]\nname = "n1"\nagent = {agent}\n'
            "[scrape]\ninterval_s = 0.2\nstale_after_s = 1\n"
        )
        return p

    def start(self, name: str) -> RunningServer:
        port = free_port()
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO_ROOT))
        argv = [sys.executable, "-m", "gateway.cli", "serve", "-c", str(self.toml(name))]
        return start_server(
            name,
            [*argv, "--listen", f"127.0.0.1:{port}", "--batch-dir", str(self.dir / f"{name}-batch")],
            port=port,
            log_path=self.dir / f"{name}.log",
            ready_path="/readyz",
            timeout_s=60,
            env=env,
            cwd=REPO_ROOT,
        )

    def fence(self) -> int:
        p = self.state.path / "fence"
        return int(p.read_text().strip()) if p.exists() else 0


@pytest.fixture
def cluster2(tmp_path: Path, redis_server: RedisServer, agent_ports: tuple[int, int]) -> Iterator[Cluster2]:
    crash = ["sh", "-c", "echo boom >&2; exit 3", "{port}"]
    (tmp_path / "models.toml").write_text(_model("sim-a", SIM, 4) + _model("crash", crash, 1))
    (tmp_path / "agent.toml").write_text(
        'models = "models.toml"\nstate_dir = "state"\nnvml = false\nheadroom_gib = 1\nrelease_wait_s = 0.2\n'
        f"stop_timeout_s = 2\nport_range = [{agent_ports[0]}, {agent_ports[1]}]\n"
        '[[devices]]\nname = "gpu0"\nmemory_gib = 7\n'
    )
    c = Cluster2(tmp_path, StateDir(tmp_path / "state"), redis_server.url, f"p{uuid.uuid4().hex[:8]}")
    yield c
    kill_engines(c.state)  # the engines outlive berth and the agent: end whatever is left


def view(berth: RunningServer) -> dict[str, Any]:
    status, body = berth.get("/admin/cluster")
    assert status == 200
    doc: dict[str, Any] = json.loads(body)["cluster"]
    return doc


def wait_members(berth: RunningServer, names: list[str]) -> None:
    berth.process.poll_until("members", lambda: view(berth)["members"] == names, 30)


def test_leader_acts_followers_forward_a_killed_leader_is_replaced_and_fenced(cluster2: Cluster2) -> None:
    a = cluster2.start("a")
    b = cluster2.start("b")
    try:
        for r in (a, b):
            wait_members(r, ["a", "b"])
        leader, follower = (a, b) if view(a)["is_leader"] else (b, a)
        assert not view(follower)["is_leader"]
        t1 = view(leader)["fencing_token"]
        assert view(follower)["fencing_token"] == t1

        # A cold start asked on the follower: the leader loads the model, the follower serves from it.
        status, body = complete(follower, "sim-a")
        assert status == 200, body
        assert metric(leader, 'berth_lifecycle_loads_total{model="sim-a",result="ok"}') == 1
        assert metric(follower, 'berth_lifecycle_loads_total{model="sim-a"') == 0
        assert cluster2.fence() == t1  # the leader's agent commands carried its token
        (rec,) = cluster2.state.records()

        # A cold start asked on the follower that fails on the leader: the follower answers the 503
        # model_load_failed a single gateway gives (not its queue timeout).
        status, body = complete(follower, "crash")
        assert status == 503
        assert body["error"]["code"] == "model_load_failed"
        assert "engine_exited" in body["error"]["message"]
        assert metric(leader, 'berth_lifecycle_loads_total{model="crash",result="failed"}') == 1

        # The leader is killed: the follower takes over within the lease, with a higher token.
        os.kill(leader.process.pid, signal.SIGKILL)
        follower.process.poll_until("takeover", lambda: view(follower)["is_leader"], 10)
        t2 = view(follower)["fencing_token"]
        assert t2 > t1
        # Its first agent command (the next list of the node) carries the new token.
        follower.process.poll_until("new token at the agent", lambda: cluster2.fence() == t2, 10)

        # The old leader's late command (sent before it died, run now) is refused, and does nothing.
        late = subprocess.run(
            [*AGENT, "-c", str(cluster2.dir / "agent.toml"), "stop", rec.id, "--fencing-token", str(t1)],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert late.returncode == 1
        assert json.loads(late.stdout)["error"]["code"] == "stale_fencing_token"
        assert [r.state.value for r in cluster2.state.records() if r.model == "sim-a"] == ["ready"]
        assert complete(follower, "sim-a")[0] == 200
    finally:
        a.process.stop()
        b.process.stop()
