"""CPU share of the processes a run can see (the 2-core budget).

The share is CPU seconds (user + system, from ``/proc/PID/stat``) over wall seconds: 1.0 is one full
core. A run is flagged when berth or loadgen itself used more than `CPU_FLAG_THRESHOLD` of a core, since
on a 2-core machine the measurement is then limited by the generator or the gateway's CPU rather than
by the fleet.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

CPU_FLAG_THRESHOLD = 0.8
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of `pid` (its threads included), or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        if pid == os.getpid():
            return time.process_time()
        return None
    rest = raw[raw.rfind(b")") + 2 :].split()
    # after "pid (comm) ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    return (int(rest[11]) + int(rest[12])) / _TICKS


def runqueue_wait_s(pid: int) -> float:
    """Seconds the process's threads spent runnable but waiting for a CPU (/proc/PID/task/*/schedstat)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
    except OSError:
        return 0.0
    return total / 1e9


@dataclass(frozen=True, slots=True)
class CpuShare:
    name: str
    pid: int
    cpu_s: float | None
    wall_s: float

    @property
    def share(self) -> float | None:
        if self.cpu_s is None or self.wall_s <= 0:
            return None
        return self.cpu_s / self.wall_s

    @property
    def flagged(self) -> bool:
        share = self.share
        return share is not None and share > CPU_FLAG_THRESHOLD

    def to_dict(self) -> dict[str, object]:
        share = self.share
        return {
            "pid": self.pid,
            "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 3),
            "cpu_share": None if share is None else round(share, 4),
            "flagged": self.flagged,
        }


class CpuSampler:
    """Start/stop snapshots of several processes' CPU time."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = dict(pids)
        self._t0 = 0.0
        self._cpu0: dict[str, float | None] = {}

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._cpu0 = {name: process_cpu_s(pid) for name, pid in self._pids.items()}

    def stop(self) -> list[CpuShare]:
        wall = time.monotonic() - self._t0
        out: list[CpuShare] = []
        for name, pid in self._pids.items():
            before, after = self._cpu0.get(name), process_cpu_s(pid)
            cpu = None if before is None or after is None else after - before
            out.append(CpuShare(name, pid, cpu, wall))
        return out
