"""How engines run: `process` (detached process groups, logs to files) or `systemd` (transient units).

A backend launches an instance from its record, tells whether it still runs, lists its processes (for
NVML's per-process memory), stops all of them (SIGTERM, the drain timeout, then SIGKILL; the whole tree,
since vLLM's EngineCore and workers outlive a killed API server) and reads its output.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final, Protocol

from gateway.agent.state import InstanceRecord

#: Every engine's environment names its instance, so its processes can be found even without a pid
#: (an agent that died between launch and writing the pid) or outside its process group.
INSTANCE_ENV: Final = "BERTH_AGENT_INSTANCE"


def instance_marker(state_dir: Path, instance_id: str) -> str:
    """The value of an engine's `INSTANCE_ENV`: its instance id within its agent's state directory. Ids
    are unique per agent only (a gateway names its instances `<model>-<n>`), and every process on the
    machine whose environment carries the marker is taken for the engine's (and stopped with it): with
    the id alone, an agent stopping its `m-1` stopped another agent's `m-1` too."""
    return f"{state_dir.resolve()}/{instance_id}"


def marker_of(rec: InstanceRecord) -> str:
    """The marker `rec`'s engine was started with (a record written before markers named their state
    directory: the bare instance id)."""
    return rec.env.get(INSTANCE_ENV, rec.id)


class Backend(Protocol):
    name: str

    def launch(self, rec: InstanceRecord, env: Mapping[str, str]) -> InstanceRecord:
        """Start the engine of `rec` (argv and the environment it adds); the record with pid/unit set.

        Raises AgentError(launch_failed) when nothing could be started.
        """
        ...

    def running(self, rec: InstanceRecord) -> bool:
        """Whether the engine still runs (its leader / unit, not a reused pid)."""
        ...

    def exit_status(self, rec: InstanceRecord) -> int | None:
        """The engine's exit status when this invocation launched it and it exited, else None."""
        ...

    def pids(self, rec: InstanceRecord) -> list[int]:
        """Every live process of the instance."""
        ...

    def stop(self, rec: InstanceRecord, timeout_s: float) -> bool:
        """End every process of the instance: SIGTERM, up to `timeout_s`, then SIGKILL.

        Returns whether SIGKILL was needed; raises AgentError(stop_failed) when processes survive it.
        """
        ...

    def logs(self, rec: InstanceRecord, tail: int) -> tuple[str, list[str]]:
        """(where the output is, its last `tail` lines)."""
        ...
