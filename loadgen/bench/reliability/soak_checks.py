"""What the soak reads to judge berth after the load: its /metrics and /admin/fleet counters, its process
(resident memory, TCP connections from /proc), and its log (error events against the faults injected;
the API keys the clients used).

Linux only (/proc), as the soak's engines are local processes anyway.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from gateway.telemetry.promtext import Exposition

#: Error-level log events a fault explains, by event name: the fault kinds that may cause each.
EXPLAINED_ERRORS: Final[Mapping[str, frozenset[str]]] = {
    "config_reload_rejected": frozenset({"reload_broken"}),
}


def rss_kib(pid: int) -> int:
    """The process's resident set size (VmRSS) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"no VmRSS for pid {pid}")


_TCP_STATES: Final = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


@dataclass(frozen=True, slots=True)
class Connections:
    """berth's open TCP sockets, by side: accepted from clients on its port, or opened to engines."""

    clients: int
    upstream: int

    def as_dict(self) -> dict[str, int]:
        return {"clients": self.clients, "upstream": self.upstream}


def connections(pid: int, listen_port: int) -> Connections:
    """Count the process's TCP sockets (not listening ones) from /proc: its fds' socket inodes against
    /proc/net/tcp{,6}."""
    inodes: set[str] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    clients = upstream = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) < 10 or cols[9] not in inodes or _TCP_STATES.get(cols[3]) == "LISTEN":
                continue
            local_port = int(cols[1].rsplit(":", 1)[1], 16)
            if local_port == listen_port:
                clients += 1
            else:
                upstream += 1
    return Connections(clients, upstream)


@dataclass(frozen=True, slots=True)
class Counters:
    """The request path's counters as berth exports them; all zero when nothing is in flight."""

    inflight: Mapping[str, float]  # endpoint -> berth_endpoint_inflight_requests
    queued: Mapping[str, float]  # model -> berth_queue_depth_requests
    waiting: float  # berth_scheduler_waiting_requests
    fleet_inflight: Mapping[str, int]  # /admin/fleet endpoints[].inflight
    fleet_queued: Mapping[str, int]  # /admin/fleet models{}.queued_total
    telemetry_pending: int  # /admin/fleet telemetry.pending (finished requests not yet folded in)
    tasks: float  # berth_asyncio_tasks
    upstream_in_use: float  # berth_upstream_connections{state="in_use"}
    upstream_idle: float  # berth_upstream_connections{state="idle"}

    @property
    def busy(self) -> list[str]:
        out = [f"inflight {k}={v:g}" for k, v in self.inflight.items() if v]
        out += [f"queued {k}={v:g}" for k, v in self.queued.items() if v]
        out += [f"fleet inflight {k}={v}" for k, v in self.fleet_inflight.items() if v]
        out += [f"fleet queued {k}={v}" for k, v in self.fleet_queued.items() if v]
        if self.waiting:
            out.append(f"waiting={self.waiting:g}")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "inflight": dict(self.inflight),
            "queued": dict(self.queued),
            "waiting": self.waiting,
            "fleet_inflight": dict(self.fleet_inflight),
            "fleet_queued": dict(self.fleet_queued),
            "telemetry_pending": self.telemetry_pending,
            "tasks": self.tasks,
            "upstream_in_use": self.upstream_in_use,
            "upstream_idle": self.upstream_idle,
        }


def counters(metrics: Exposition, fleet: Mapping[str, Any]) -> Counters:
    return Counters(
        inflight={s.labels["endpoint"]: s.value for s in metrics.samples("berth_endpoint_inflight_requests")},
        queued={s.labels["model"]: s.value for s in metrics.samples("berth_queue_depth_requests")},
        waiting=metrics.value("berth_scheduler_waiting_requests") or 0.0,
        fleet_inflight={e["id"]: int(e["inflight"]) for e in fleet["endpoints"]},
        fleet_queued={m: int(v["queued_total"]) for m, v in fleet["models"].items()},
        telemetry_pending=int(fleet["telemetry"]["pending"]),
        tasks=metrics.value("berth_asyncio_tasks") or 0.0,
        upstream_in_use=metrics.value("berth_upstream_connections", state="in_use") or 0.0,
        upstream_idle=metrics.value("berth_upstream_connections", state="idle") or 0.0,
    )


@dataclass(frozen=True, slots=True)
class LogVerdict:
    lines: int
    errors: Mapping[str, int]  # error-level events by name
    unexplained: Mapping[str, int]  # the ones no injected fault explains
    unparsed: int  # lines that are not berth's JSON (a stray traceback, a library's plain-text line)
    unparsed_sample: list[str]
    outcomes: Mapping[str, int]  # the canonical request lines' outcomes

    def as_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "errors": dict(self.errors),
            "unexplained": dict(self.unexplained),
            "unparsed": self.unparsed,
            "unparsed_sample": self.unparsed_sample,
            "request_outcomes": dict(self.outcomes),
        }


def judge_log(path: Path, injected: Iterable[str]) -> LogVerdict:
    """Classify every error-level event of berth's log against the fault kinds `injected`."""
    kinds = set(injected)
    errors: Counter[str] = Counter()
    unexplained: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    unparsed: list[str] = []
    lines = 0
    with path.open("rb") as f:
        next(f, None)  # the harness's "$ argv" line
        for raw in f:
            lines += 1
            try:
                event = orjson.loads(raw)
            except orjson.JSONDecodeError:
                unparsed.append(raw.decode(errors="replace").rstrip())
                continue
            if not isinstance(event, dict):
                unparsed.append(raw.decode(errors="replace").rstrip())
                continue
            name = str(event.get("event"))
            if name == "request":
                outcomes[str(event.get("outcome"))] += 1
            if event.get("level") in ("error", "critical"):
                errors[name] += 1
                if not EXPLAINED_ERRORS.get(name, frozenset()) & kinds:
                    unexplained[name] += 1
    return LogVerdict(lines, errors, unexplained, len(unparsed), unparsed[:5], outcomes)


def secrets_in(path: Path, secrets: Iterable[str]) -> list[str]:
    """Which of `secrets` occur in the file (a prefix of each is named, never the secret itself)."""
    text = path.read_bytes()
    return [s[:6] + "..." for s in secrets if s.encode() in text]


_BEARER: Final = re.compile(rb"Bearer\s+\S")


def bearer_tokens_in(path: Path) -> int:
    """Lines of the file that carry an `Authorization: Bearer` value."""
    return sum(1 for line in path.read_bytes().splitlines() if _BEARER.search(line))
