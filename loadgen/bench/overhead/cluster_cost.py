"""What cluster mode costs per request: berth standalone vs berth with [cluster] (a real redis-server), the
same tenant limits, the same fast upstream (`overhead_upstream`), closed-loop load from the overhead
benchmark's client process, rounds interleaved.

Per configuration and round: berth's CPU per request (utime+stime from /proc over the window), Redis's
CPU per request (INFO cpu, used_cpu_user + used_cpu_sys over the window) and Redis round trips per request
(INFO commandstats: script calls, i.e. EVALSHA + EVAL, over the window; the replica's own beats, a few a
second, are included). A request carries a tenant key whose tenant has requests_per_s, tokens_per_min and
max_concurrency set (high enough never to refuse), so every request takes the shared-limits path; with
`--task` every request also carries x-berth-task-id (the shared task clock's round trip).

    berth-loadgen bench cluster-cost --out DIR           # 3 rounds of 8 s per configuration
    berth-loadgen bench cluster-cost --quick --out DIR   # seconds: checks the machinery

Output: DIR/report.json, DIR/report.md.

The figures are medians over rounds; ratios are cluster ÷ standalone within a round, then the median.
One machine: berth, Redis, the upstream and the client share its cores (say so beside the figures).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import orjson
import redis

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.overhead.overhead_client import Command
from loadgen.bench.overhead.overhead_procs import CHAT_PATH, Client, HarnessError, start_upstream
from loadgen.bench.skeleton import run_bench
from loadgen.harness import REPO_ROOT, ManagedProcess, ServerStartError, start_server
from loadgen.redis_server import RedisServer

KEY: Final = "sk-bench-tenant-0001"
TENANT: Final = (
    '[[tenants]]\nname = "bench"\napi_keys = ["' + KEY + '"]\n'
    "requests_per_s = 1000000\ntokens_per_min = 1000000000000\nmax_concurrency = 100000\n"
)


def gateway_toml(upstreams: list[str], redis_url: str | None) -> str:
    eps = "".join(f'[[endpoints]]\nurl = "{u}"\nengine = "vllm"\n' for u in upstreams)
    cluster = "" if redis_url is None else f'[cluster]\nredis = "{redis_url}"\nname = "bench-1"\n'
    return f'[server]\nlog_level = "warning"\n{cluster}{TENANT}{eps}'


def start_berth_with(toml: Path, logdir: Path, name: str) -> tuple[ManagedProcess, str]:
    from loadgen.harness import free_port

    port = free_port()
    server = start_server(
        name,
        [sys.executable, "-m", "gateway.cli", "serve", "-c", str(toml), "--listen", f"127.0.0.1:{port}"],
        port=port,
        log_path=logdir / f"{name}.log",
        ready_path="/readyz",
        timeout_s=30,
        cwd=REPO_ROOT,
    )
    return server.process, server.base_url


def redis_counts(r: redis.Redis) -> tuple[int, float]:
    """(script calls so far, Redis CPU seconds so far)."""
    stats = r.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    cpu = r.info("cpu")
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def one(
    client: Client,
    toml: Path,
    name: str,
    args: argparse.Namespace,
    *,
    logdir: Path,
    redis_client: redis.Redis,
    redis_pid: int,
) -> dict[str, Any]:
    proc, base = start_berth_with(toml, logdir, name)
    try:
        cmd = Command(
            url=base + CHAT_PATH,
            concurrency=args.concurrency,
            warmup_s=args.warmup,
            duration_s=args.duration,
            stream=False,
            max_tokens=8,
            cpu_pids=(proc.pid, redis_pid),
            model="bench",
            api_key=KEY,
        )
        # The window's Redis counters: read around the client's run (its warm-up is a little inside).
        calls0, cpu0 = redis_counts(redis_client)
        res = client.run(cmd)
        calls1, cpu1 = redis_counts(redis_client)
    finally:
        proc.stop(10)
    n = res["completed"]
    if res["errors"] or not n:
        raise HarnessError(f"{name}: {res['errors']} errors: {res['error_samples']}")
    berth_cpu = res["cpu_s"][str(proc.pid)]
    redis_cpu = res["cpu_s"][str(redis_pid)]
    total = n * (args.duration + args.warmup) / args.duration  # requests over the counters' span
    return {
        "rps": res["rps"],
        "berth_cpu_us": 1e6 * berth_cpu / n,
        "redis_cpu_us": 1e6 * redis_cpu / n,
        "redis_info_cpu_us": 1e6 * (cpu1 - cpu0) / total,
        "round_trips": (calls1 - calls0) / total,
        "p50_ms": res["lat_ms"]["p50"],
        "p99_ms": res["lat_ms"]["p99"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    logdir = Path(tempfile.mkdtemp(prefix="berth-cluster-cost-"))
    srv = RedisServer(logdir)
    srv.start()
    upstream, urls = start_upstream(
        argparse.Namespace(python=sys.executable, chunk_interval_ms=0), logdir, None
    )
    client = Client(sys.executable, logdir, None)
    rc = redis.Redis(port=srv.port)
    rounds: list[dict[str, dict[str, Any]]] = []
    try:
        standalone = logdir / "standalone.toml"
        standalone.write_text(gateway_toml(urls, None))
        cluster = logdir / "cluster.toml"
        cluster.write_text(gateway_toml(urls, srv.url))
        for i in range(args.rounds):
            order = [("standalone", standalone), ("cluster", cluster)]
            if i % 2:
                order.reverse()
            got = {
                name: one(client, toml, name, args, logdir=logdir, redis_client=rc, redis_pid=srv.pid)
                for name, toml in order
            }
            print(f"round {i + 1}: {orjson.dumps(got).decode()}", file=sys.stderr)
            rounds.append(got)
    finally:
        client.stop()
        upstream.process.stop(10)
        srv.stop()
    med = {
        cfg: {k: statistics.median(r[cfg][k] for r in rounds) for k in rounds[0][cfg]}
        for cfg in ("standalone", "cluster")
    }
    ratio = statistics.median(r["cluster"]["berth_cpu_us"] / r["standalone"]["berth_cpu_us"] for r in rounds)
    return {
        "rounds": rounds,
        "median": med,
        "cpu_ratio": ratio,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def summary(report: dict[str, Any]) -> str:
    """The medians per configuration and berth's CPU ratio (report.md)."""
    lines = ["# What cluster mode costs per request", "", "```"]
    m = report["median"]
    for cfg in ("standalone", "cluster"):
        f = m[cfg]
        lines.append(
            f"{cfg:10s} rps {f['rps']:7.0f}  berth CPU/request {f['berth_cpu_us']:6.1f} µs  "
            f"Redis CPU/request {f['redis_cpu_us']:5.1f} µs  "
            f"Redis round trips/request {f['round_trips']:.2f}  "
            f"p50 {f['p50_ms']:.2f} ms  p99 {f['p99_ms']:.2f} ms"
        )
    lines += [f"cluster ÷ standalone berth CPU per request: {report['cpu_ratio']:.3f}", "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="berth-loadgen bench cluster-cost", description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=Path("bench-out/cluster-cost"), help="report directory")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = min(args.rounds, 1)
        args.duration, args.warmup = min(args.duration, 1.5), min(args.warmup, 0.3)

    def measure(a: argparse.Namespace) -> dict[str, Any]:
        report = run(a)
        print(summary(report))
        return report

    return run_bench(
        BENCHMARKS["cluster-cost"],
        args,
        measure,
        report=lambda r: (r, summary(r)),
        failures=(HarnessError, ServerStartError, OSError),
    )


if __name__ == "__main__":
    sys.exit(main())
