"""The overhead benchmark's processes: the load generator (`overhead_client`, driven over its stdin and
stdout), the stand-in upstream, berth and the bare aiohttp proxy, each started and awaited until it
answers; where they run with `--pin` (`cpu_layout`); and one line per measurement for the log."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Final

import orjson

from loadgen.bench.overhead.overhead_client import Command
from loadgen.bench.overhead.overhead_harness import bare_lag_args
from loadgen.bench.overhead.overhead_lag import LOOP_LAG_PATH
from loadgen.bench.overhead.overhead_report import Measurement
from loadgen.harness import (
    REPO_ROOT,
    ManagedProcess,
    RunningServer,
    ServerStartError,
    free_port,
    pinned,
    start_berth,
    start_server,
)

CHAT_PATH: Final = "/v1/chat/completions"
START_TIMEOUT_S: Final = 30.0
STOP_GRACE_S: Final = 15.0


FLEET_MODEL: Final = "bench"


class HarnessError(RuntimeError):
    """The load generator process failed."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_layout(pin: bool) -> dict[str, frozenset[int] | None]:
    """CPUs for the client, the upstream and the proxy under test with --pin (None: anywhere).

    The proxy gets a CPU of its own so that added latency is its service time rather than a queue
    behind the client; on two CPUs the client and the upstream share the other one.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return {"client": None, "upstream": None, "proxy": None}
    if len(cpus) == 2:
        return {"client": frozenset(cpus[:1]), "upstream": frozenset(cpus[:1]), "proxy": frozenset(cpus[1:])}
    return {"client": frozenset(cpus[:1]), "upstream": frozenset(cpus[1:2]), "proxy": frozenset(cpus[2:3])}


class Client:
    """The load generator process: one JSON command per line in, one JSON result per line out."""

    def __init__(self, python: str, logdir: Path, cpus: frozenset[int] | None) -> None:
        # Not a server (`loadgen.harness`): its stdin and stdout are the protocol.
        self._stderr = (logdir / "client.log").open("wb")
        self.proc = subprocess.Popen(
            pinned([python, "-m", "loadgen.bench.overhead.overhead_client"], cpus),
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )

    def run(self, cmd: Command) -> dict[str, Any]:
        self.send(cmd)
        return self.result()

    def send(self, cmd: Command) -> None:
        """Start a phase; `result` waits for its end."""
        stdin: IO[bytes] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(orjson.dumps(asdict(cmd)) + b"\n")
        stdin.flush()

    def result(self) -> dict[str, Any]:
        """The result of the phase `send` started, once it ends."""
        stdout: IO[bytes] | None = self.proc.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise HarnessError(f"the load generator exited (status {self.proc.poll()})")
        reply: dict[str, Any] = orjson.loads(line)
        if not reply["ok"]:
            raise HarnessError(f"the load generator failed: {reply['error']}")
        result: dict[str, Any] = reply["result"]
        return result

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


@dataclass(frozen=True, slots=True)
class Target:
    config: str
    base_url: str
    proxy: ManagedProcess | None


def start_upstream(
    args: argparse.Namespace, logdir: Path, cpus: frozenset[int] | None
) -> tuple[RunningServer, list[str]]:
    """The stand-in upstream (`overhead_upstream`) on two ports; it and the two base URLs."""
    up_port, up_port2 = free_port(), free_port()
    upstream = start_server(
        "upstream",
        [args.python, "-m", "loadgen.bench.overhead.overhead_upstream", "--port", str(up_port),
         "--port", str(up_port2), "--chunk-interval-ms", str(args.chunk_interval_ms)],
        port=up_port, log_path=logdir / "upstream.log", ready_path="/health",
        timeout_s=START_TIMEOUT_S, cwd=REPO_ROOT, cpus=cpus,
    )  # fmt: skip
    return upstream, [upstream.base_url, f"http://127.0.0.1:{up_port2}"]


def start_proxy_berth(
    args: argparse.Namespace,
    upstream_urls: Sequence[str],
    logdir: Path,
    cpus: frozenset[int] | None,
    *,
    name: str = "berth",
    cwd: Path = REPO_ROOT,
) -> tuple[ManagedProcess, str]:
    """berth in front of the upstreams, once it answers a completion; its process and base URL. `cwd`:
    the checkout whose berth runs."""
    more = [a for url in upstream_urls[1:] for a in ("--endpoint", f"{url},engine=vllm")]
    server = start_berth(
        f"{upstream_urls[0]},engine=vllm",
        logdir / f"{name}.log",
        extra_args=[*more, *shlex.split(args.berth_args)],
        log_level="warning",
        python=args.python,
        cwd=cwd,
        cpus=cpus,
        timeout_s=START_TIMEOUT_S,
    )
    try:
        # /readyz may turn 200 before the endpoint's models are known: wait for a real answer.
        wait_for_completion(server.base_url + CHAT_PATH, server.process)
    except BaseException:
        server.process.stop(STOP_GRACE_S)
        raise
    return server.process, server.base_url


def start_bare(
    args: argparse.Namespace,
    upstream_urls: Sequence[str],
    logdir: Path,
    cpus: frozenset[int] | None,
    *,
    name: str = "bare",
) -> tuple[ManagedProcess, str]:
    """The bare aiohttp proxy (`overhead_bare_proxy`) in front of the upstreams; its process and base URL."""
    port = free_port()
    bare = start_server(
        name,
        [args.python, "-m", "loadgen.bench.overhead.overhead_bare_proxy", "--port", str(port),
         *(a for url in upstream_urls for a in ("--upstream", url)), *bare_lag_args(args)],
        port=port,
        log_path=logdir / f"{name}.log",
        ready_path=LOOP_LAG_PATH,
        timeout_s=START_TIMEOUT_S,
        cwd=REPO_ROOT,
        cpus=cpus,
    )  # fmt: skip
    return bare.process, bare.base_url


def wait_for_completion(url: str, proc: ManagedProcess, timeout_s: float = START_TIMEOUT_S) -> None:
    body = orjson.dumps(
        {"model": FLEET_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    )
    last = ""

    def answers() -> bool:
        nonlocal last
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=2.0) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}: {e.read()[:300]!r}"
        except OSError as e:
            last = repr(e)
        return False

    try:
        proc.poll_until(f"a completion answered at {url}", answers, timeout_s)
    except ServerStartError as e:
        raise ServerStartError(f"{e}\n--- the last answer ---\n{last}") from None


def describe(m: Measurement) -> str:
    cpu = m.proxy_cpu_us_per_request()
    text = f"{m.rps:8.0f} req/s  p50 {m.lat_ms.get('p50', 0):6.2f} ms  p99 {m.lat_ms.get('p99', 0):6.2f} ms"
    if m.ttft_ms:
        text += f"  ttfc p50 {m.ttft_ms.get('p50', 0):6.2f} ms"
    if cpu is not None:
        text += f"  proxy {cpu:7.1f} µs/req"
        per_chunk = m.proxy_cpu_us_per_chunk()
        if per_chunk is not None:
            text += f" {per_chunk:6.2f} µs/chunk"
    if m.lag_s:
        text += "  lag p50/p99/max {p50:.3f}/{p99:.3f}/{max:.2f} ms".format(**m.lag_ms())
    if m.errors:
        text += f"  errors {m.errors}"
    return text
