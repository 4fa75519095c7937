"""What /proc says about processes: identity (pid + start time), process groups, CPU time.

A pid alone does not name a process across invocations of the agent (pids are reused), so an instance
record keeps its leader's pid *and* start time (field 22 of /proc/PID/stat, clock ticks since boot).
Zombies count as gone: the engine's parent after the launching CLI exits is whatever reaps orphans here.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    state: str  # R S D Z T ...
    ppid: int
    pgrp: int
    session: int
    cpu_ticks: int  # utime + stime
    start_ticks: int  # since boot

    @property
    def gone(self) -> bool:
        return self.state in ("Z", "X")


def stat(pid: int) -> ProcStat | None:
    """The process's /proc/PID/stat, or None when there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) is in parentheses and may contain anything, so split after the last ")".
    rest = text[text.rindex(")") + 2 :].split()
    return ProcStat(
        pid=pid,
        state=rest[0],
        ppid=int(rest[1]),
        pgrp=int(rest[2]),
        session=int(rest[3]),
        cpu_ticks=int(rest[11]) + int(rest[12]),
        start_ticks=int(rest[19]),
    )


def start_ticks(pid: int) -> int | None:
    s = stat(pid)
    return None if s is None or s.gone else s.start_ticks


def alive(pid: int, started: int) -> bool:
    """Whether the process `pid` that started at `started` ticks still runs (not a reused pid, no zombie)."""
    s = stat(pid)
    return s is not None and not s.gone and s.start_ticks == started


def group_members(pgid: int, *, since_ticks: int = 0) -> list[int]:
    """Live processes of process group `pgid` that started at or after `since_ticks`.

    `since_ticks` (the leader's start time) leaves out processes older than the leader: they cannot be
    members of the group it created, even if its id was since reused.
    """
    out: list[int] = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        s = stat(int(entry.name))
        if s is not None and s.pgrp == pgid and not s.gone and s.start_ticks >= since_ticks:
            out.append(s.pid)
    return sorted(out)


def with_env(key: str, value: str) -> list[int]:
    """Live processes whose environment has `key=value` (the ones this user may read)."""
    needle = f"{key}={value}".encode()
    out: list[int] = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            s = stat(int(entry.name))
            if s is not None and not s.gone:
                out.append(s.pid)
    return sorted(out)


def cpu_ticks(pids: list[int]) -> int:
    """CPU time used so far by the live processes among `pids` (ticks)."""
    total = 0
    for pid in pids:
        s = stat(pid)
        if s is not None and not s.gone:
            total += s.cpu_ticks
    return total


def cgroup_procs(cgroup: str) -> list[int]:
    """The processes of a cgroup v2 path such as `/user.slice/.../berth-engine-x.service`."""
    try:
        text = (Path("/sys/fs/cgroup") / cgroup.lstrip("/") / "cgroup.procs").read_text()
    except OSError:
        return []
    return sorted(int(line) for line in text.split() if line.isdigit())


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
