"""The process backend: each engine is the leader of its own session and process group.

`start_new_session` detaches the engine from the short-lived CLI (it keeps running when the CLI exits and
gets no signal meant for the CLI's terminal); its stdout and stderr go to STATE_DIR/logs/ID.log. A stop
signals the whole group, so workers the engine forked go with it, and checks in /proc that none is left.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec.structs

from gateway.agent import procs
from gateway.agent.backends import INSTANCE_ENV, marker_of
from gateway.agent.contract import AgentError, ErrorCode
from gateway.agent.state import InstanceRecord
from gateway.agent.wait import poll_until

#: How long processes get to disappear after SIGKILL before the stop is reported as failed.
KILL_WAIT_S: Final = 10.0


class ProcessBackend:
    name = "process"

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # launched by this invocation

    def launch(self, rec: InstanceRecord, env: Mapping[str, str]) -> InstanceRecord:
        assert rec.log_file is not None
        try:
            with open(rec.log_file, "ab", buffering=0) as log:
                child = subprocess.Popen(
                    rec.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, **env},
                    cwd=self._workdir,
                    close_fds=True,
                )
        except OSError as e:
            raise AgentError.of(
                ErrorCode.LAUNCH_FAILED, f"cannot run {rec.argv[0]!r}: {e.strerror or e}", instance=rec.id
            ) from None
        self._children[child.pid] = child
        started = procs.start_ticks(child.pid)
        return msgspec.structs.replace(rec, pid=child.pid, pid_start=started if started is not None else 0)

    def running(self, rec: InstanceRecord) -> bool:
        if rec.pid is None:
            return False
        child = self._children.get(rec.pid)
        if child is not None:
            return child.poll() is None
        return rec.pid_start is not None and procs.alive(rec.pid, rec.pid_start)

    def exit_status(self, rec: InstanceRecord) -> int | None:
        child = self._children.get(rec.pid) if rec.pid is not None else None
        return None if child is None else child.poll()

    def pids(self, rec: InstanceRecord) -> list[int]:
        """The engine's process group, and any process carrying its instance marker (one that left the
        group, or all of them when the pid was never recorded)."""
        self._reap(rec)
        group: list[int] = []
        if rec.pid is not None and self._group_is_ours(rec):
            group = procs.group_members(rec.pid, since_ticks=rec.pid_start or 0)
        return sorted({*group, *procs.with_env(INSTANCE_ENV, marker_of(rec))})

    def stop(self, rec: InstanceRecord, timeout_s: float) -> bool:
        if not self.pids(rec):
            return False

        def gone() -> bool:
            return not self.pids(rec)

        self._signal(rec, signal.SIGTERM)
        if poll_until(gone, timeout_s):
            return False
        self._signal(rec, signal.SIGKILL)
        if not poll_until(gone, KILL_WAIT_S):
            left = self.pids(rec)
            raise AgentError.of(
                ErrorCode.STOP_FAILED,
                f"processes {left} of instance {rec.id} survived SIGKILL",
                instance=rec.id,
            )
        return True

    def logs(self, rec: InstanceRecord, tail: int) -> tuple[str, list[str]]:
        path = rec.log_file or ""
        try:
            with open(path, "rb") as f:
                lines = collections.deque(f, maxlen=tail) if tail > 0 else collections.deque()
        except OSError:
            return path, []
        return path, [line.decode("utf-8", "replace").rstrip("\n") for line in lines]

    def _group_is_ours(self, rec: InstanceRecord) -> bool:
        """Whether process group `rec.pid` is still the engine's: its leader is the engine (same start
        time) or gone. A live leader that started at another time means the pid, and with it the group
        id, was reused by something else: then only the instance marker finds the engine's processes."""
        if rec.pid is None:
            return False
        leader = procs.stat(rec.pid)
        return leader is None or leader.gone or leader.start_ticks == rec.pid_start

    def _signal(self, rec: InstanceRecord, sig: int) -> None:
        if rec.pid is not None and self._group_is_ours(rec):
            procs.signal_group(rec.pid, sig)
        for pid in procs.with_env(INSTANCE_ENV, marker_of(rec)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _reap(self, rec: InstanceRecord) -> None:
        """Collect the exit status of a child this invocation started, so it does not linger as a zombie."""
        child = self._children.get(rec.pid) if rec.pid is not None else None
        if child is not None:
            child.poll()
