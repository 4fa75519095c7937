"""A node agent that refuses a start for memory the gateway did not count (NVML measuring an engine above
what it was admitted with): berth plans again, evicting what the drift leaves no room beside, and the
waiting request is served instead of answered 503.

The agent is the real one behind a shim that answers the first `start` with the agent's own
`insufficient_memory` error, its per-device numbers saying sim-a's engine holds 6 GiB (admitted with 4).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.agent.state import StateDir
from tests.integration.agent_engines import kill_engines
from tests.integration.test_lifecycle_agents import SIM, Setup, _model, complete, fleet, metric

GIB = 1 << 30
SHIM = """
import json, os, pathlib, sys
marker = pathlib.Path(sys.argv[1])
args = sys.argv[2:]
if "start" in args and "sim-b" in args and not marker.exists():
    marker.write_text("refused once")
    fit = {"name": "gpu0", "capacity_bytes": 10 * 2**30, "reserved_bytes": 8 * 2**30,
           "required_bytes": 4 * 2**30, "free_bytes": 2 * 2**30, "fits": False, "loading": None}
    print(json.dumps({"error": {"code": "insufficient_memory", "model": "sim-b", "devices": [fit],
                                "message": "gpu0: 2 GiB free, 4 GiB required (sim-a measured 6 GiB)"}}))
    sys.exit(1)
os.execv(sys.executable, [sys.executable, "-m", "gateway.agent", *args])
"""


@pytest.fixture
def setup(tmp_path: Path, agent_ports: tuple[int, int]) -> Iterator[Setup]:
    (tmp_path / "models.toml").write_text("\n".join([_model("sim-a", SIM, 4), _model("sim-b", SIM, 4)]))
    (tmp_path / "agent.toml").write_text(
        'models = "models.toml"\nstate_dir = "state"\nnvml = false\nheadroom_gib = 1\nrelease_wait_s = 0.2\n'
        f"stop_timeout_s = 2\nport_range = [{agent_ports[0]}, {agent_ports[1]}]\n"
        '[[devices]]\nname = "gpu0"\nmemory_gib = 11\n'  # capacity 10 GiB: both 4 GiB models, by the book
    )
    (tmp_path / "shim.py").write_text(SHIM)
    agent = json.dumps(
        [
            sys.executable,
            str(tmp_path / "shim.py"),
            str(tmp_path / "refused"),
            "-c",
            str(tmp_path / "agent.toml"),
        ]
    )
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
    kill_engines(s.state)


def test_a_memory_refusal_evicts_and_serves_instead_of_503(setup: Setup) -> None:
    berth = setup.start()
    try:
        assert complete(berth, "sim-a")[0] == 200
        # By the gateway's count sim-b fits beside sim-a; the agent refuses (drift), berth learns the
        # 2 GiB it did not count, evicts sim-a and serves the request that waited.
        status, body = complete(berth, "sim-b")
        assert status == 200, body
        assert (setup.dir / "refused").is_file()  # the refusal did happen
        assert metric(berth, 'berth_lifecycle_loads_total{model="sim-b",result="refused"}') == 1
        assert metric(berth, 'berth_lifecycle_loads_total{model="sim-b",result="ok"}') == 1
        by_model: dict[str, list[str]] = {}
        for i in fleet(berth)["instances"]:
            by_model.setdefault(i["model"], []).append(i["state"])
        assert by_model["sim-a"] == ["stopped"]
        assert sorted(by_model["sim-b"]) == ["failed", "ready"]  # the refused instance, then the one that ran
        assert metric(berth, 'berth_lifecycle_evictions_total{reason="evicted"}') == 1
    finally:
        berth.process.stop()
