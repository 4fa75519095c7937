"""What does berth add? One run measures it against the same fast upstream, three ways, interleaved.

- direct: the client talks to the upstream itself;
- bare:   through the peer harness's aiohttp reference proxy (`overhead_bare_proxy`: parses the body,
          round robin, bytes passed through; the floor for a Python proxy);
- berth:  through `python -m gateway.cli serve`.

The figures are those of the peer harness (`../shared/perf-peers`, `bench_gateway.sh`), with its phase
names; each round runs every phase for every configuration back to back (the order rotates per round):

- sat:    non-streamed requests, 64 connections (closed loop) -> requests/s, proxy CPU per request;
- lat8:   8 connections -> p50/p99 latency minus direct's (added latency);
- lat1:   1 connection -> added latency, and CPU per request without batching;
- stream: waves of 64 streams sent together, `--chunks` chunks each paced `--chunk-interval-ms` apart
          by the upstream -> proxy CPU per chunk, time to first chunk minus direct's;
- fleet:  (once) each proxy in front of a `--fleet-count`-endpoint simulated fleet, 8 connections ->
          event-loop lag; berth scrapes every endpoint's /metrics on its schedule, the bare proxy
          only spreads the requests round robin;
- queue:  (once, only when asked: `--tests queue`) each proxy in front of a `--fleet-count`-endpoint
          simulated fleet whose seats are all taken (`--queue-cap` each), clients keeping
          `--queue-depth` more requests waiting (the coding workload's tasks, with their headers), berth
          running `--queue-policy` (coding-assistant) -> event-loop lag of both, berth's scheduler call
          times (`overhead_queue`).

Proxy CPU is utime+stime from `/proc/<pid>/stat` over the measurement window. Both proxies run berth's
event-loop lag monitor (`gateway.core.looplag`: a timer every `--lag-interval-ms`, 10 by default, how late
it fires); the samples each took during a phase are read from its `GET /admin/loop-lag`
(`overhead_lag`) and give the phase's lag p50, p99 and max, side by side: at 8 connections
the closed loop keeps the proxy's core busy, so a timer waits about one loop iteration behind the
requests' callbacks (load, which the bare proxy pays too), while a stall (one long callback) shows as
berth's lag above the bare proxy's. Figures are medians over rounds; ratios are berth ÷ bare within a
round, then the median. The targets: added p99 at 8 connections <= 2x the bare proxy's; lag p99 <= the
bare proxy's in the same run + 0.5 ms, at 8 connections, with the fleet scraped and with the standing
queue; no scheduler call over 5 ms with the standing queue; CPU per request <=
1.3x at saturation and at 1 connection; CPU per chunk <= 1.2x; added time to first chunk at 64 streams <=
1.5x. The proxies get a CPU of their own with `--pin` (as the harness pins them); latency figures need
that, or idle CPUs, to mean anything.

`--harness DIR` runs the peer harness itself instead (its `bench.py`: wrk, nginx stand-ins, its
stream client; see `overhead_harness`) and folds its results, with berth's lag, into the
same report. `--quick` is a seconds-long run that checks the machinery, not the figures.

    berth-loadgen bench overhead --pin --out DIR                          # about 4 minutes
    berth-loadgen bench overhead --harness /tmp/perf-peers --out DIR
    berth-loadgen bench overhead --quick --out DIR                        # seconds: the machinery
    berth-loadgen bench overhead --tests queue --out DIR                  # about 2 minutes

Output: DIR/report.json, DIR/report.md.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.overhead import proxy_args
from loadgen.bench.overhead.overhead_client import Command
from loadgen.bench.overhead.overhead_harness import HarnessFailed, run_harness
from loadgen.bench.overhead.overhead_lag import lag_since, mark_lag
from loadgen.bench.overhead.overhead_procs import (
    CHAT_PATH,
    FLEET_MODEL,
    STOP_GRACE_S,
    Client,
    HarnessError,
    Target,
    cpu_layout,
    describe,
    log,
    start_bare,
    start_proxy_berth,
    start_upstream,
)
from loadgen.bench.overhead.overhead_queue import measure_queue, queue_checks, queue_lines
from loadgen.bench.overhead.overhead_report import (
    CONFIGS,
    FLEET,
    LAT1,
    LAT8,
    QUEUE,
    SATURATION,
    STREAM,
    Load,
    Measurement,
    checks,
    fleet_lag,
    ratios,
    render_table,
    summarise,
    verdict,
)
from loadgen.bench.overhead.proxy_record import markdown, run_meta
from loadgen.bench.skeleton import run_bench
from loadgen.harness import REPO_ROOT, ManagedProcess, ServerStartError, start_engine_sim


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    concurrency: int
    stream: bool
    max_tokens: int
    waves: bool = False


def phases(args: argparse.Namespace) -> list[Phase]:
    """The phases `--tests` asks for, in their fixed order (the fleet phase runs apart: `measure_fleet`)."""
    every = [
        Phase(SATURATION, args.saturation_concurrency, stream=False, max_tokens=16),
        Phase(LAT8, args.latency_concurrency, stream=False, max_tokens=16),
        Phase(LAT1, 1, stream=False, max_tokens=16),
        Phase(STREAM, args.stream_concurrency, stream=True, max_tokens=args.chunks, waves=True),
    ]
    return [p for p in every if p.name in args.tests]


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
        waves=phase.waves,
    )
    mark = mark_lag(target.base_url) if target.proxy is not None else None
    r = client.run(cmd)
    lag = lag_since(target.base_url, mark) or ()
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
        lag_s=tuple(lag),
    )
    samples: list[str] = r["error_samples"]
    return m, samples


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
        upstream, upstreams = start_upstream(args, logdir, layout["upstream"])
        servers.append(upstream.process)
        targets: list[Target] = []
        for config in args.configs:
            if config == "direct":
                targets.append(Target("direct", upstream.base_url, None))
            elif config == "bare":
                bare, bare_url = start_bare(args, upstreams, logdir, layout["proxy"])
                servers.append(bare)
                targets.append(Target("bare", bare_url, bare))
            elif config == "berth":
                try:
                    berth, berth_url = start_proxy_berth(args, upstreams, logdir, layout["proxy"])
                except ServerStartError as e:
                    log(f"berth is not measured: {e}")
                    unavailable["berth"] = str(e)
                    continue
                servers.append(berth)
                targets.append(Target("berth", berth_url, berth))
        yield upstream.process, targets, unavailable
    finally:
        for server in reversed(servers):
            server.stop(STOP_GRACE_S)


def lag_sampling(args: argparse.Namespace, logdir: Path) -> None:
    """Both proxies' lag monitors sample every `--lag-interval-ms` (berth through a config file of only
    `[ops] loop_lag_interval_s`, put before `--berth-args`, so a `-c` there wins; the bare proxy through
    its flag). At the operators' default of 100 ms a 10 s phase has 100 samples, and its "p99" is its
    second largest: a noise figure. 0 leaves both at their default (a `--python` running an older
    checkout that has no such key)."""
    if args.lag_interval_ms <= 0:
        return
    conf = logdir / "lag-sampling.toml"
    conf.write_text(f"[ops]\nloop_lag_interval_s = {args.lag_interval_ms / 1000.0!r}\n")
    args.berth_args = f"-c {shlex.quote(str(conf))} {args.berth_args}".strip()


def run(args: argparse.Namespace) -> dict[str, Any]:
    logdir = Path(tempfile.mkdtemp(prefix="berth-overhead-"))
    lag_sampling(args, logdir)
    started = time.time()
    error_samples: dict[str, list[str]] = {}
    measurements: list[Measurement] = []
    unavailable: dict[str, str] = {}
    if not phases(args):
        pass  # the fleet phase alone
    elif args.harness is not None:
        measurements, unavailable = run_harness(args.harness, args, logdir)
    else:
        measurements, unavailable = _run_builtin(args, logdir, error_samples)
    if FLEET in args.tests and args.fleet_count > 0 and {"bare", "berth"} & set(args.configs):
        try:
            measurements.extend(measure_fleet(args, logdir, cpu_layout(args.pin)))
        except (HarnessError, ServerStartError) as e:
            log(f"the fleet phase is not measured: {e}")
            unavailable[FLEET] = str(e)
    if QUEUE in args.tests and args.fleet_count > 0 and {"bare", "berth"} & set(args.configs):
        try:
            measurements.extend(measure_queue(args, logdir, cpu_layout(args.pin), error_samples))
        except (HarnessError, ServerStartError) as e:
            log(f"the standing-queue phase is not measured: {e}")
            unavailable[QUEUE] = str(e)
    return report(args, measurements, unavailable, error_samples, started=started, logdir=logdir)


def report(
    args: argparse.Namespace,
    measurements: list[Measurement],
    unavailable: dict[str, str],
    error_samples: dict[str, list[str]],
    *,
    started: float,
    logdir: Path,
) -> dict[str, Any]:
    standard = [m for m in measurements if m.phase != QUEUE]  # the standing queue has a table of its own
    configs = [c for c in CONFIGS if any(m.config == c for m in standard)]
    summaries = {c: summarise(standard, c) for c in configs}
    rs = ratios(measurements)
    load = Load(
        args.saturation_concurrency, args.latency_concurrency, args.stream_concurrency, args.chunks,
        args.fleet_count,
    )  # fmt: skip
    cs = (
        []
        if all(m.phase == QUEUE for m in measurements)
        else checks(summaries, rs, load, fleet_lag(measurements), fleet_lag(measurements, "bare"))
    )
    cs += queue_checks(measurements, args.fleet_count, args.queue_depth)
    table = render_table(
        summaries, rs, cs, load, extra=queue_lines(measurements, args.fleet_count, args.queue_depth)
    )
    return {
        "benchmark": "overhead",
        "meta": run_meta(args, started, logdir),
        "unavailable": unavailable,
        "summary": {c: asdict(s) for c, s in summaries.items()},
        "ratios_berth_over_bare": asdict(rs),
        "targets": [{**asdict(c), "verdict": c.verdict} for c in cs],
        "verdict": verdict(cs) if not unavailable else "INCOMPLETE",
        "error_samples": error_samples,
        "measurements": [asdict(m) for m in measurements],
        "table": table,
    }


def _run_builtin(
    args: argparse.Namespace, logdir: Path, error_samples: dict[str, list[str]]
) -> tuple[list[Measurement], dict[str, str]]:
    measurements: list[Measurement] = []
    layout = cpu_layout(args.pin)
    with fleet(args, logdir, layout) as (upstream, targets, unavailable):
        client = Client(args.python, logdir, layout["client"])
        try:
            plan = phases(args)
            for target in targets:  # connections, caches and lazy imports before anything counts
                for phase in plan:
                    prime = Command(
                        url=target.base_url + CHAT_PATH, concurrency=phase.concurrency, warmup_s=0.0,
                        duration_s=min(0.5, args.duration), stream=phase.stream, max_tokens=phase.max_tokens,
                        waves=phase.waves,
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
                        log(f"{where} {describe(m)}")
        finally:
            client.stop()
    return measurements, unavailable


def measure_fleet(
    args: argparse.Namespace, logdir: Path, layout: dict[str, frozenset[int] | None]
) -> list[Measurement]:
    """Each proxy (bare, berth) in front of `--fleet-count` simulated endpoints (one engine-sim process)
    under `--latency-concurrency` connections of short requests: its event-loop lag over
    `--fleet-duration` seconds. berth scrapes every endpoint on its schedule; the bare proxy scrapes
    nothing, so the difference is what berth's background work over a fleet costs the loop."""
    sim, urls = start_engine_sim(
        ["--count", str(args.fleet_count), "--port", "0", "--profile", "test-fast", "--model", FLEET_MODEL],
        logdir / "fleet-sim.log",
        endpoints=args.fleet_count,
        python=args.python,
        cwd=REPO_ROOT,
    )
    out: list[Measurement] = []
    with sim:
        for config in [c for c in ("bare", "berth") if c in args.configs]:
            if config == "berth":
                proxy, base_url = start_proxy_berth(args, urls, logdir, layout["proxy"], name="berth-fleet")
            else:
                proxy, base_url = start_bare(args, urls, logdir, layout["proxy"], name="bare-fleet")
            with proxy:
                out.append(_fleet_phase(args, logdir, layout["client"], Target(config, base_url, proxy)))
    return out


def _fleet_phase(
    args: argparse.Namespace, logdir: Path, client_cpus: frozenset[int] | None, target: Target
) -> Measurement:
    proxy, base_url, config = target.proxy, target.base_url, target.config
    assert proxy is not None
    client = Client(args.python, logdir, client_cpus)
    try:
        cmd = Command(
            url=base_url + CHAT_PATH, concurrency=args.latency_concurrency, warmup_s=args.warmup,
            duration_s=args.fleet_duration, stream=False, max_tokens=4, cpu_pids=(proxy.pid,),
            model=FLEET_MODEL,
        )  # fmt: skip
        mark = mark_lag(base_url)
        r = client.run(cmd)
        lag = lag_since(base_url, mark) or ()
    finally:
        client.stop()
    m = Measurement(
        round=0,
        phase=FLEET,
        config=config,
        concurrency=args.latency_concurrency,
        max_tokens=4,
        completed=r["completed"],
        errors=r["errors"],
        window_s=r["window_s"],
        rps=r["rps"],
        lat_ms=r["lat_ms"],
        ttft_ms=r["ttft_ms"],
        chunks=0,
        proxy_cpu_s=r["cpu_s"][str(proxy.pid)],
        upstream_cpu_s=None,
        lag_s=tuple(lag),
    )
    log(f"fleet of {args.fleet_count} endpoints, {config} {describe(m)}")
    return m


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return proxy_args.parse_args(argv, __doc__ or "")


def main(argv: Sequence[str] | None = None) -> int:
    def measure(args: argparse.Namespace) -> dict[str, Any]:
        result = run(args)
        print(result["table"])
        for what, why in result["unavailable"].items():
            print(f"\n{what} was not measured: {why.splitlines()[0] if why else ''}")
        print(f"\nserver logs: {result['meta']['logs']}")
        return result

    return run_bench(
        BENCHMARKS["overhead"],
        parse_args(argv),
        measure,
        passed=lambda r: r["verdict"] == "PASS",
        report=lambda r: (r, markdown(r)),
        failures=(HarnessError, HarnessFailed, ServerStartError),
    )


if __name__ == "__main__":
    raise SystemExit(main())
