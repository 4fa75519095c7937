"""The state directory: one JSON record per instance (written before launch), logs, and the node lock.

    STATE_DIR/lock                 fcntl.flock: one invocation at a time changes the node
    STATE_DIR/fence                the highest --fencing-token seen (replaced atomically)
    STATE_DIR/fence.lock           fcntl.flock: the fence is read and written by one invocation at a time
    STATE_DIR/instances/ID.json    InstanceRecord, replaced atomically (write, fsync, rename)
    STATE_DIR/logs/ID.log          the process backend's engine output

The directory is created 0750 and files 0640: local control is by file modes (DESIGN.md, "Node agent").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import msgspec

from gateway.agent.contract import RESIDENT_STATES, InstanceState

#: What an instance id may be: it names files and systemd units.
ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class InstanceRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    model: str
    engine: str
    state: InstanceState
    backend: str
    host: str  # where the engine listens
    url: str  # how clients reach it
    port: int
    devices: tuple[str, ...]
    device_indices: tuple[int, ...]
    memory_bytes: int  # per device, as admitted
    argv: tuple[str, ...]
    env: dict[str, str]  # what the agent added to the engine's environment
    health_path: str
    started_at: float  # Unix seconds: the record was written
    load_deadline: float  # Unix seconds: starting past this is a failed load
    log_file: str | None = None  # process backend
    unit: str | None = None  # systemd backend
    pid: int | None = None
    pid_start: int | None = None  # clock ticks since boot (procs.start_ticks)
    owner_pid: int | None = None  # the invocation starting or stopping it (`start` waits for health)
    owner_start: int | None = None
    ready_at: float | None = None
    load_s: float | None = None
    stopped_at: float | None = None
    reason: str | None = None
    config: str | None = None  # the model's instance configuration it runs ([[models.configs]])
    max_batch: int | None = None  # that configuration's max batch

    @property
    def resident(self) -> bool:
        return self.state in RESIDENT_STATES

    @property
    def health_url(self) -> str:
        """The health route as the agent probes it: on this machine, where the engine listens."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}{self.health_path}"


class StaleFencingToken(Exception):
    def __init__(self, message: str, *, highest: int) -> None:
        super().__init__(message)
        self.highest = highest


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.instances = path / "instances"
        self.logs = path / "logs"

    def ensure(self) -> None:
        for d in (self.path, self.instances, self.logs):
            d.mkdir(mode=0o750, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the node lock (blocks while another invocation holds it)."""
        self.ensure()
        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def fence(self, token: int) -> int:
        """Admit a command carrying fencing token `token`: the highest token seen on this node before it
        (0: none) when `token` is at least that (a higher one is remembered, atomically), or raise
        StaleFencingToken and remember nothing. A lock of its own: a start holds the node lock only
        while it changes the books, but the fence must be checked before anything is done."""
        self.ensure()
        fd = os.open(self.path / "fence.lock", os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            path = self.path / "fence"
            try:
                highest = int(path.read_text(encoding="ascii").strip() or "0")
            except FileNotFoundError:
                highest = 0
            except (OSError, ValueError) as e:
                raise StaleFencingToken(f"cannot read {path}: {e}", highest=-1) from None
            if token < highest:
                raise StaleFencingToken(
                    f"fencing token {token} is below {highest}, the highest this node has seen: "
                    "a newer gateway leader has taken over",
                    highest=highest,
                )
            if token > highest:
                tmp = self.path / ".fence.tmp"
                wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
                try:
                    os.write(wfd, f"{token}\n".encode())
                    os.fsync(wfd)
                finally:
                    os.close(wfd)
                os.replace(tmp, path)
            return highest
        finally:
            os.close(fd)

    def records(self) -> list[InstanceRecord]:
        out = []
        for p in sorted(self.instances.glob("*.json")):
            try:
                out.append(msgspec.json.decode(p.read_bytes(), type=InstanceRecord))
            except (OSError, msgspec.DecodeError):
                continue  # a half-written tmp file never has the .json name; anything else is not ours
        return out

    def read(self, instance_id: str) -> InstanceRecord | None:
        if not ID_PATTERN.match(instance_id):
            return None
        try:
            return msgspec.json.decode(
                (self.instances / f"{instance_id}.json").read_bytes(), type=InstanceRecord
            )
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def write(self, rec: InstanceRecord) -> None:
        self.ensure()
        final = self.instances / f"{rec.id}.json"
        tmp = self.instances / f".{rec.id}.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            os.write(fd, msgspec.json.encode(rec))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)

    def remove(self, instance_id: str) -> None:
        """Forget an instance: its record and its log file."""
        for p in (self.instances / f"{instance_id}.json", self.log_path(instance_id)):
            p.unlink(missing_ok=True)

    def log_path(self, instance_id: str) -> Path:
        return self.logs / f"{instance_id}.log"
