"""What does berth add? One run measures it against the same fast upstream, three ways, interleaved.

- direct: the client talks to the upstream itself;
- bare:   through a ~60-line aiohttp + uvloop pass-through proxy (the floor for a Python proxy);
- berth:  through `python -m gateway.cli serve`.

Each round runs three phases for every configuration back to back (the order rotates per round);
clients are closed-loop (each sends its next request when the last one is done):

- saturation: non-streaming requests, 64 concurrent clients -> requests/s, proxy CPU per request;
- latency:    non-streaming requests, 8 concurrent clients -> p50/p99 latency minus direct's;
- stream:     streams of `--chunks` chunks (paced `--chunk-interval-ms` apart by the upstream, so
              each arrives alone as a real engine's tokens do), 16 concurrent -> proxy CPU per chunk.

Proxy CPU is utime+stime from `/proc/<pid>/stat` of the proxy process over the measurement window,
the steadiest figure on a shared machine. The upstream and the load generator run in processes of
their own. Figures are medians over rounds; the table ends with berth's targets: CPU per request and
per streamed chunk at most 1.5x the bare proxy's, p99 added latency at 8 concurrent at most 2 ms.
Latency figures need idle CPUs to mean anything: with fewer than three free cores the client, the
upstream and the proxy queue behind each other and the added latency is mostly that queueing.

    python -m loadgen.bench.overhead                      # all three configurations, about 2 minutes
    python -m loadgen.bench.overhead --configs direct,bare --rounds 5 --out reports/overhead.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Final

import orjson

from loadgen.bench.overhead_client import Command
from loadgen.bench.overhead_report import (
    CONFIGS,
    LATENCY,
    SATURATION,
    STREAM,
    Load,
    Measurement,
    checks,
    ratios,
    render_table,
    summarise,
    verdict,
)
from loadgen.harness import (
    REPO_ROOT,
    ManagedProcess,
    ServerStartError,
    free_port,
    pinned,
    start_berth,
    start_server,
)

CHAT_PATH: Final = "/v1/chat/completions"
START_TIMEOUT_S: Final = 30.0
STOP_GRACE_S: Final = 15.0


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    concurrency: int
    stream: bool
    max_tokens: int


class HarnessError(RuntimeError):
    """The load generator process failed."""


def _log(msg: str) -> None:
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
            pinned([python, "-m", "loadgen.bench.overhead_client"], cpus),
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )

    def run(self, cmd: Command) -> dict[str, Any]:
        stdin: IO[bytes] | None = self.proc.stdin
        stdout: IO[bytes] | None = self.proc.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(orjson.dumps(asdict(cmd)) + b"\n")
        stdin.flush()
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


def start_proxy_berth(
    args: argparse.Namespace, upstream_url: str, logdir: Path, cpus: frozenset[int] | None
) -> tuple[ManagedProcess, str]:
    """berth in front of the upstream, once it answers a completion; its process and base URL."""
    server = start_berth(
        f"{upstream_url},engine=vllm",
        logdir / "berth.log",
        extra_args=shlex.split(args.berth_args),
        log_level="warning",
        python=args.python,
        cwd=REPO_ROOT,
        cpus=cpus,
        timeout_s=START_TIMEOUT_S,
    )
    try:
        # /readyz may turn 200 before the endpoint's models are known: wait for a real answer.
        _wait_for_completion(server.base_url + CHAT_PATH, server.process)
    except BaseException:
        server.process.stop(STOP_GRACE_S)
        raise
    return server.process, server.base_url


def _wait_for_completion(url: str, proc: ManagedProcess, timeout_s: float = START_TIMEOUT_S) -> None:
    body = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
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


def phases(args: argparse.Namespace) -> list[Phase]:
    return [
        Phase(SATURATION, args.saturation_concurrency, stream=False, max_tokens=16),
        Phase(LATENCY, args.latency_concurrency, stream=False, max_tokens=16),
        Phase(STREAM, args.stream_concurrency, stream=True, max_tokens=args.chunks),
    ]


def measure(
    client: Client,
    target: Target,
    phase: Phase,
    *,
    round_no: int,
    upstream: ManagedProcess,
    args: argparse.Namespace,
) -> tuple[Measurement, list[str]]:
    """Run one phase against one configuration; the measurement and a few error messages, if any."""
    pids = (upstream.pid,) if target.proxy is None else (target.proxy.pid, upstream.pid)
    cmd = Command(
        url=target.base_url + CHAT_PATH,
        concurrency=phase.concurrency,
        warmup_s=args.warmup,
        duration_s=args.duration,
        stream=phase.stream,
        max_tokens=phase.max_tokens,
        cpu_pids=pids,
    )
    r = client.run(cmd)
    cpu: dict[str, float] = r["cpu_s"]
    m = Measurement(
        round=round_no,
        phase=phase.name,
        config=target.config,
        concurrency=phase.concurrency,
        max_tokens=phase.max_tokens,
        completed=r["completed"],
        errors=r["errors"],
        window_s=r["window_s"],
        rps=r["rps"],
        lat_ms=r["lat_ms"],
        ttft_ms=r["ttft_ms"],
        chunks=r["chunks"],
        proxy_cpu_s=None if target.proxy is None else cpu[str(target.proxy.pid)],
        upstream_cpu_s=cpu[str(upstream.pid)],
    )
    samples: list[str] = r["error_samples"]
    return m, samples


def _describe(m: Measurement) -> str:
    cpu = m.proxy_cpu_us_per_request()
    text = f"{m.rps:8.0f} req/s  p50 {m.lat_ms.get('p50', 0):6.2f} ms  p99 {m.lat_ms.get('p99', 0):6.2f} ms"
    if cpu is not None:
        text += f"  proxy {cpu:7.1f} µs/req"
        if m.chunks:
            text += f" {m.proxy_cpu_s * 1e6 / m.chunks if m.proxy_cpu_s else 0:6.2f} µs/chunk"
    if m.errors:
        text += f"  errors {m.errors}"
    return text


@contextlib.contextmanager
def fleet(
    args: argparse.Namespace, logdir: Path, layout: dict[str, frozenset[int] | None]
) -> Iterator[tuple[ManagedProcess, list[Target], dict[str, str]]]:
    """Start the upstream and the proxies asked for; stop them all on the way out.

    Yields the upstream, the targets that started, and why the others (berth) could not.
    """
    servers: list[ManagedProcess] = []
    unavailable: dict[str, str] = {}
    try:
        up_port = free_port()
        upstream = start_server(
            "upstream",
            [args.python, "-m", "loadgen.bench.overhead_upstream", "--port", str(up_port),
             "--chunk-interval-ms", str(args.chunk_interval_ms)],
            port=up_port,
            log_path=logdir / "upstream.log",
            ready_path="/health",
            timeout_s=START_TIMEOUT_S,
            cwd=REPO_ROOT,
            cpus=layout["upstream"],
        )  # fmt: skip
        servers.append(upstream.process)
        targets: list[Target] = []
        for config in args.configs:
            if config == "direct":
                targets.append(Target("direct", upstream.base_url, None))
            elif config == "bare":
                port = free_port()
                bare = start_server(
                    "bare",
                    [args.python, "-m", "loadgen.bench.overhead_bare_proxy", "--port", str(port),
                     "--upstream", upstream.base_url],
                    port=port,
                    log_path=logdir / "bare.log",
                    ready_path="/health",
                    timeout_s=START_TIMEOUT_S,
                    cwd=REPO_ROOT,
                    cpus=layout["proxy"],
                )  # fmt: skip
                servers.append(bare.process)
                targets.append(Target("bare", bare.base_url, bare.process))
            elif config == "berth":
                try:
                    berth, berth_url = start_proxy_berth(args, upstream.base_url, logdir, layout["proxy"])
                except ServerStartError as e:
                    _log(f"berth is not measured: {e}")
                    unavailable["berth"] = str(e)
                    continue
                servers.append(berth)
                targets.append(Target("berth", berth_url, berth))
        yield upstream.process, targets, unavailable
    finally:
        for server in reversed(servers):
            server.stop(STOP_GRACE_S)


def run(args: argparse.Namespace) -> dict[str, Any]:
    logdir = Path(tempfile.mkdtemp(prefix="berth-overhead-"))
    started = time.time()
    measurements: list[Measurement] = []
    error_samples: dict[str, list[str]] = {}
    layout = cpu_layout(args.pin)
    with fleet(args, logdir, layout) as (upstream, targets, unavailable):
        client = Client(args.python, logdir, layout["client"])
        try:
            plan = phases(args)
            for target in targets:  # connections, caches and lazy imports before anything counts
                for phase in plan:
                    prime = Command(
                        url=target.base_url + CHAT_PATH, concurrency=phase.concurrency, warmup_s=0.0,
                        duration_s=0.5, stream=phase.stream, max_tokens=phase.max_tokens,
                    )  # fmt: skip
                    client.run(prime)
            for round_no in range(args.rounds):
                for phase in plan:
                    shift = round_no % len(targets)
                    for target in targets[shift:] + targets[:shift]:
                        m, samples = measure(
                            client, target, phase, round_no=round_no, upstream=upstream, args=args
                        )
                        measurements.append(m)
                        if samples:
                            error_samples.setdefault(target.config, []).extend(samples)
                        where = f"round {round_no + 1}/{args.rounds} {phase.name:10} {target.config:6}"
                        _log(f"{where} {_describe(m)}")
        finally:
            client.stop()
    configs = [c for c in CONFIGS if any(m.config == c for m in measurements)]
    summaries = {c: summarise(measurements, c) for c in configs}
    rs = ratios(measurements)
    load = Load(args.saturation_concurrency, args.latency_concurrency, args.stream_concurrency, args.chunks)
    cs = checks(summaries, rs, load)
    table = render_table(summaries, rs, cs, load)
    return {
        "benchmark": "overhead",
        "meta": _meta(args, started, logdir),
        "unavailable": unavailable,
        "summary": {c: asdict(s) for c, s in summaries.items()},
        "ratios_berth_over_bare": asdict(rs),
        "targets": [{**asdict(c), "verdict": c.verdict} for c in cs],
        "verdict": verdict(cs) if "berth" not in unavailable else "INCOMPLETE",
        "error_samples": error_samples,
        "measurements": [asdict(m) for m in measurements],
        "table": table,
    }


def _meta(args: argparse.Namespace, started: float, logdir: Path) -> dict[str, Any]:
    def git(*argv: str) -> str:
        try:
            out = subprocess.run(
                ["git", *argv], check=False, cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
            )
        except OSError:
            return ""
        return out.stdout.strip()

    options = {k: v for k, v in vars(args).items() if k != "out"}
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "elapsed_s": round(time.time() - started, 1),
        "options": options,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "cpu_layout": {k: sorted(v) if v is not None else None for k, v in cpu_layout(args.pin).items()},
        "logs": str(logdir),
    }


def _configs(text: str) -> list[str]:
    configs = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        raise argparse.ArgumentTypeError(f"choose from {','.join(CONFIGS)} (got {text!r})")
    return list(dict.fromkeys(configs))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadgen.bench.overhead", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--configs", type=_configs, default=list(CONFIGS), help="default: direct,bare,berth")
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds per phase (default 3)")
    p.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each phase")
    p.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds; figures are medians (default 3)"
    )
    p.add_argument(
        "--chunks", type=int, default=200, help="chunks per stream in the stream phase (default 200)"
    )
    p.add_argument("--chunk-interval-ms", type=float, default=1.0, help="upstream pause between chunks")
    p.add_argument("--saturation-concurrency", type=int, default=64)
    p.add_argument("--latency-concurrency", type=int, default=8)
    p.add_argument("--stream-concurrency", type=int, default=16)
    p.add_argument("--python", default=sys.executable, help="interpreter for the servers and the client")
    p.add_argument("--berth-args", default="", help="extra arguments for `berth serve` (one shell string)")
    p.add_argument("--out", type=Path, default=Path("reports/bench-overhead.json"), help="JSON report path")
    p.add_argument(
        "--pin", action="store_true",
        help="give the proxy a CPU of its own (client and upstream on others); steadier latency figures",
    )  # fmt: skip
    p.add_argument("--fail-on-target", action="store_true", help="exit 1 unless every target passes")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        report = run(args)
    except (HarnessError, ServerStartError) as e:
        _log(f"overhead benchmark failed: {e}")
        return 2
    print(report["table"])
    if report["unavailable"]:
        for config, why in report["unavailable"].items():
            print(f"\n{config} was not measured: {why.splitlines()[0]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"\nreport: {args.out}  (server logs: {report['meta']['logs']})")
    if args.fail_on_target and report["verdict"] != "PASS":
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
