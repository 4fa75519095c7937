"""A real redis-server for cluster mode's tests and benchmarks: started on a free loopback port, ready
when it says so on its stdout (no polling), stopped by its pid. `redis-server` must be on PATH (Debian:
the redis-server package; `make test` installs it)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

READY = b"Ready to accept connections"
START_TIMEOUT_S = 10.0


MISSING = (
    "redis-server is not on PATH (Debian/Ubuntu: apt-get install redis-server; elsewhere Redis >= 7 or "
    "Valkey's server installed as redis-server); `make test` installs it"
)


class RedisMissing(RuntimeError):
    pass


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise RedisMissing(MISSING)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """One redis-server process on 127.0.0.1:`port` (no persistence); `stop` and `start` again keep the
    port (a Redis restart, as clients see it)."""

    def __init__(self, workdir: Path, *, password: str | None = None) -> None:
        self.binary = redis_server_binary()
        self.port = free_port()
        self.password = password
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--logfile",
            "",
            "--loglevel",
            "notice",
        ]
        if self.password is not None:
            argv += ["--requirepass", self.password]
        proc = self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        ready = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            with proc.stdout as out:  # closed at the end of the output (the server exited)
                for line in out:  # keep draining so the server never blocks on a full pipe
                    if READY in line:
                        ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(START_TIMEOUT_S) or proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: Redis holds every connection and answers nothing (a slow or hung Redis)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid
