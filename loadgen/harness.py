"""Servers as child processes, for the benchmarks and the test tiers that run real processes: a free
port, the process in its own process group with its output in a log file, a readiness wait that fails
fast (with the tail of the log) when the process exits first, and a stop that reaches the whole group.

Why a process group of its own: engines fork (vLLM's engine core outlives its API server when only the
leader is signalled), and Ctrl-C at a benchmark reaches the benchmark alone, which then stops its
children itself. `stop` sends SIGTERM to the group and, after a grace period, SIGKILL to whatever is
left of it.

Why a log file: a child that writes into a pipe nobody reads blocks once the pipe is full. A process
whose output announces that it is ready (vLLM's "Application startup complete", the engine simulator's
URLs) is started with `watch=`: its output then goes through a pipe that a thread drains into the log
file, keeping the lines that contain `watch` for `wait_for_lines`. Any other process writes to the log
file directly.

No bare sleeps: a readiness poll pauses in a wait on the process itself, so a crash ends the wait at
once and the error carries the log's tail.

Synchronous (blocking calls, one thread per watched process): async callers run the waits and `stop`
with `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

REPO_ROOT: Final = Path(__file__).resolve().parent.parent

BERTH_READY_TIMEOUT_S: Final = 60.0
SIM_READY_TIMEOUT_S: Final = 60.0
STOP_GRACE_S: Final = 30.0
HTTP_TIMEOUT_S: Final = 10.0
POLL_INTERVAL_S: Final = 0.1
#: The engine simulator prints one line per endpoint, ending in " at URL", once it serves.
SIM_READY_MARK: Final = b" at http://"
#: Where port blocks are claimed (`port_block`): one lock file per block, shared by every checkout.
PORT_BLOCKS_DIR: Final = Path("/tmp/berth-port-blocks")
PORT_BLOCKS_FROM: Final = 10_000
PORT_BLOCK_SIZE: Final = 200  # one size for every block, so that two blocks never overlap


class ServerStartError(Exception):
    """A server process did not come up; the message names its log and quotes its last lines."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def port_block() -> Iterator[tuple[int, int]]:
    """(first, last) of `PORT_BLOCK_SIZE` ports that no other holder of a block (any test or process of
    any checkout on this machine) is given until this one leaves the block: a node agent's `port_range`.

    An agent checks that a port binds, then its engine binds it a second or more later. With a range
    from `free_port()` that port was in the kernel's ephemeral range, where every process's port-0 bind
    and outgoing connection takes ports, and another test's agent could pick it too: the engine then
    failed to bind ("address already in use"). The blocks lie below the ephemeral range, and each is
    claimed by an exclusive lock on its own file."""
    low, size = _ephemeral_low(), PORT_BLOCK_SIZE
    PORT_BLOCKS_DIR.mkdir(exist_ok=True)
    for first in range(PORT_BLOCKS_FROM, low - size + 1, size):
        lock = open(PORT_BLOCKS_DIR / f"{first}.lock", "ab")  # noqa: SIM115 (held across the yield)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        try:
            yield first, first + size - 1
        finally:
            lock.close()  # (closing releases the lock)
        return
    raise RuntimeError(f"no free block of {size} ports below {low}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def pinned(argv: Sequence[str], cpus: Collection[int] | None) -> list[str]:
    """`argv` run on `cpus` only (through `taskset`, so every thread and child of it is pinned from its
    first instruction); `argv` unchanged when `cpus` is None."""
    if cpus is None:
        return list(argv)
    return ["taskset", "--cpu-list", ",".join(str(c) for c in sorted(cpus)), *argv]


def http_get(url: str, timeout_s: float = HTTP_TIMEOUT_S) -> tuple[int, str]:
    """(status, body); a connection failure is status 0."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def http_post_json(url: str, body: dict[str, object], timeout_s: float = 60.0) -> dict[str, object]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        decoded: dict[str, object] = json.loads(resp.read())
        return decoded


class ManagedProcess:
    """A child process in its own process group, its output (stdout and stderr) in `log_path`, which
    starts with the command line. See the module docstring for `watch`."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        cpus: Collection[int] | None = None,
        watch: bytes | None = None,
    ) -> None:
        self.name = name
        self.argv = pinned(argv, cpus)
        self.log_path = log_path
        self._watch = watch
        self._seen: list[str] = []  # output lines that contain `watch`
        self._closed = False  # the output pipe closed (the process is exiting)
        self._changed = threading.Condition()
        self._stopped = False
        log_path.write_bytes(f"$ {' '.join(self.argv)}\n".encode())
        self._reader: threading.Thread | None = None
        with log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log if watch is None else subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,  # its own process group (see the module docstring)
            )
        if watch is not None:
            self._reader = threading.Thread(target=self._drain, name=f"{name}-output", daemon=True)
            self._reader.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has exited, else None."""
        return self._proc.poll()

    def _drain(self) -> None:
        assert self._proc.stdout is not None
        watch = self._watch
        with self._proc.stdout as out, self.log_path.open("ab") as log:
            for line in out:
                log.write(line)
                log.flush()
                if watch is not None and watch in line:
                    with self._changed:
                        self._seen.append(line.decode(errors="replace").rstrip("\r\n"))
                        self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> ServerStartError:
        """An error that says what went wrong, whether the process still runs, and the log's tail."""
        code = self._proc.poll()
        state = "still running" if code is None else f"exited with code {code}"
        return ServerStartError(
            f"{self.name} {what} ({state}); log: {self.log_path}\n--- last lines ---\n{self.log_tail()}"
        )

    def wait_for_lines(self, count: int, timeout_s: float) -> list[str]:
        """The first `count` output lines that contain `watch`, once printed; raises `ServerStartError`
        after `timeout_s`, or at once when the process closes its output first."""
        if self._watch is None:
            raise ValueError(f"{self.name} was started without watch=")
        with self._changed:
            done = self._changed.wait_for(lambda: len(self._seen) >= count or self._closed, timeout_s)
            seen = list(self._seen)
        if len(seen) >= count:
            return seen[:count]
        if not done:
            raise self.failure(f"did not print {count} lines with {self._watch!r} within {timeout_s:.0f} s")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(STOP_GRACE_S)  # its output closed: it is exiting; get the exit code
        raise self.failure(f"closed its output after {len(seen)} of {count} lines with {self._watch!r}")

    def poll_until(self, what: str, check: Callable[[], bool], timeout_s: float) -> None:
        """Ask `check` every POLL_INTERVAL_S until it is true; raises `ServerStartError` after
        `timeout_s`, or at once when the process exits.

        Only for facts a server tells solely when asked over HTTP (its /readyz, a document on an admin
        route): there is no event to await. The pause between asks is a wait on the process itself.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if check():
                return
            if time.monotonic() >= deadline:
                raise self.failure(f"never reached: {what} (waited {timeout_s:.0f} s)")
            try:
                self._proc.wait(POLL_INTERVAL_S)
            except subprocess.TimeoutExpired:
                continue
            raise self.failure(f"exited while waiting for: {what}")

    def wait_until_ok(self, url: str, timeout_s: float) -> None:
        """`poll_until` GET `url` answers 200."""
        self.poll_until(f"GET {url} answers 200", lambda: http_get(url)[0] == 200, timeout_s)

    def send_signal(self, sig: int) -> None:
        """`sig` to the process itself (not its group)."""
        self._proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        """The exit status, once the process exits; raises `subprocess.TimeoutExpired` after `timeout_s`."""
        return self._proc.wait(timeout_s)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group; after `grace_s`, SIGKILL whatever is left of it. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(grace_s)
        with contextlib.suppress(ProcessLookupError):
            # The leader if it ignored SIGTERM, or a child (vLLM's engine core) that outlived it.
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        if self._reader is not None:
            self._reader.join(grace_s)


@dataclass(frozen=True)
class RunningServer:
    name: str
    base_url: str  # http://127.0.0.1:PORT, no trailing slash
    process: ManagedProcess

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.base_url + path)

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200, f"{self.name} /metrics answered {status}: {body[:200]}"
        return body


def start_server(
    name: str,
    argv: Sequence[str],
    *,
    port: int,
    log_path: Path,
    ready_path: str,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    cpus: Collection[int] | None = None,
) -> RunningServer:
    """`argv` (a server that listens on 127.0.0.1:`port`), once GET `ready_path` answers 200. On
    failure the process is stopped and `ServerStartError` raised."""
    proc = ManagedProcess(name, argv, log_path=log_path, env=env, cwd=cwd, cpus=cpus)
    server = RunningServer(name, f"http://127.0.0.1:{port}", proc)
    try:
        proc.wait_until_ok(server.base_url + ready_path, timeout_s)
    except BaseException:
        proc.stop()
        raise
    return server


def serve_argv(config: Path, batch_dir: Path, *extra: str) -> list[str]:
    """`python -m gateway.cli serve -c CONFIG --batch-dir DIR EXTRA...`: a berth whose batches live in
    `batch_dir`, never in the directory it runs in."""
    return [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "-c",
        str(config),
        "--batch-dir",
        str(batch_dir),
        *extra,
    ]


def start_berth(
    endpoint: str,
    log_path: Path,
    *,
    extra_args: Sequence[str] = (),
    log_level: str = "info",
    python: str = sys.executable,
    cwd: Path = REPO_ROOT,
    cpus: Collection[int] | None = None,
    timeout_s: float = BERTH_READY_TIMEOUT_S,
) -> RunningServer:
    """`python -m gateway.cli serve` in front of `endpoint` ("URL,engine=.."), ready (its /readyz is 200:
    config loaded and the engine scraped as ready). `cwd`: the checkout whose berth runs. Its batches
    live beside its log (`<log name>-batch/`) unless `extra_args` give a `--batch-dir`: never in `cwd`."""
    port = free_port()
    if "--batch-dir" not in extra_args:
        extra_args = [*extra_args, "--batch-dir", str(log_path.with_name(f"{log_path.stem}-batch"))]
    argv = [
        python, "-m", "gateway.cli", "serve",
        "--listen", f"127.0.0.1:{port}",
        "--endpoint", endpoint,
        "--log-level", log_level,
        *extra_args,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return start_server(
        "berth",
        argv,
        port=port,
        log_path=log_path,
        ready_path="/readyz",
        timeout_s=timeout_s,
        env=env,
        cwd=cwd,
        cpus=cpus,
    )


def start_engine_sim(
    args: Sequence[str],
    log_path: Path,
    *,
    endpoints: int = 1,
    python: str = sys.executable,
    cwd: Path | None = None,
    timeout_s: float = SIM_READY_TIMEOUT_S,
) -> tuple[ManagedProcess, list[str]]:
    """`python -m loadgen.engine_sim.cli ARGS` (with ``--port 0`` among `args` its endpoints take free
    ports), and the URLs of its `endpoints` endpoints once it serves them all."""
    proc = ManagedProcess(
        "engine-sim",
        [python, "-m", "loadgen.engine_sim.cli", *args],
        log_path=log_path,
        cwd=cwd,
        watch=SIM_READY_MARK,
    )
    try:
        lines = proc.wait_for_lines(endpoints, timeout_s)
    except BaseException:
        proc.stop()
        raise
    return proc, [line.rsplit(" at ", 1)[1].strip() for line in lines]
