"""What the tests with a real node agent share: the engine simulator's command line for a models.toml, and
the end of every engine the agent started (engines outlive berth and the agent)."""

from __future__ import annotations

import os
import signal
import sys

from gateway.agent import procs
from gateway.agent.state import StateDir


def sim_command(load_time_s: float) -> list[str]:
    """A models.toml `command`: the engine simulator serving `{model}` on `{port}` after `load_time_s`."""
    return [
        sys.executable,
        "-m",
        "loadgen.engine_sim.cli",
        "--model",
        "{model}",
        "--port",
        "{port}",
        "--load-time-s",
        f"{load_time_s:g}",
    ]


def kill_engines(state: StateDir) -> None:
    """SIGKILL whatever is left of each engine the agent's state records (its whole process group)."""
    for rec in state.records():
        if rec.pid is not None:
            for pid in procs.group_members(rec.pid, since_ticks=rec.pid_start or 0):
                os.kill(pid, signal.SIGKILL)
