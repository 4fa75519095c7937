"""``berth-loadgen``: run workloads against berth (or any OpenAI endpoint) and compare reports.

    berth-loadgen run --target http://127.0.0.1:8080 --workload coding:pattern2 --rate 2 --duration 120 \\
        --arrival gamma --cv 2 --seed 1 --out report.json [--plot out.png] [--record sent.jsonl] \\
        [--berth-pid PID]
    berth-loadgen compare baseline.json slack.json
    berth-loadgen workloads
    berth-loadgen workload-stats --workload mooncake:trace.jsonl --duration 0 [--block-size 512]
    berth-loadgen sim --policy policies/coding-assistant.toml --fleet fleet.toml --workload coding:pattern1 \
        --rate 8 --duration 120 --seed 1 --out report.json [--plot sim.png] [--gateway gateway.toml]
    berth-loadgen bench --list                          # every benchmark and the question it answers
    berth-loadgen bench NAME [--quick] --out DIR        # loadgen/bench/<question>/ (docs/benchmarks.md)
    berth-loadgen diag --list                           # the diagnostics (docs/diagnostics.md)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp

from loadgen.plot import PlotUnavailable, plot_report
from loadgen.progress import ProgressBar
from loadgen.render import format_compare, format_report
from loadgen.report import Report, load_report
from loadgen.runner import RunOptions, build_schedule, run_workload
from loadgen.workloads import BUILTIN_NAMES, VARIANTS, WorkloadOptions, get_workload
from loadgen.workloads.options import parse_range
from loadgen.workloads.stats import format_reuse, reusable_share


def _catalogue_run(
    kind: str,
    name: str | None,
    listing: Callable[[], str],
    module_of: Callable[[str], str | None],
    argv: Sequence[str],
) -> int:
    """`bench NAME ARGS...` / `diag NAME ARGS...`: the module of NAME, imported only when asked for (each has
    `main(argv)`); no NAME (or --list) lists them."""
    if name is None:
        print(listing())
        return 0
    module = module_of(name)
    if module is None:
        print(
            f"berth-loadgen {kind}: unknown {kind} {name!r}; `berth-loadgen {kind} --list`", file=sys.stderr
        )
        return 2
    run: Callable[[Sequence[str]], int | None] = importlib.import_module(module).main
    return run(list(argv)) or 0


def _bench(name: str | None, argv: Sequence[str]) -> int:
    from loadgen.bench.catalogue import BENCHMARKS

    def module_of(n: str) -> str | None:
        b = BENCHMARKS.get(n)
        return None if b is None else b.module

    return _catalogue_run("bench", name, BENCHMARKS.listing, module_of, argv)


def _diag(name: str | None, argv: Sequence[str]) -> int:
    from loadgen.diag.catalogue import DIAGNOSTICS, listing

    def module_of(n: str) -> str | None:
        d = DIAGNOSTICS.get(n)
        return None if d is None else d.module

    return _catalogue_run("diag", name, listing, module_of, argv)


def _workload_arguments() -> argparse.ArgumentParser:
    """The workload and its schedule: what `run`, `sim` and `workload-stats` share."""
    w = argparse.ArgumentParser(add_help=False)
    w.add_argument(
        "--workload",
        default="sharegpt-like",
        help=f"{' | '.join(BUILTIN_NAMES)}[:variant], mooncake:PATH or a JSONL trace",
    )
    w.add_argument("--rate", type=float, default=1.0, help="mean task arrivals per second")
    w.add_argument(
        "--duration", type=float, default=60.0, help="seconds of arrivals (a trace: cut-off, 0 = all)"
    )
    w.add_argument("--arrival", choices=("poisson", "gamma"), default="poisson")
    w.add_argument("--cv", type=float, default=1.0, help="gamma arrivals: coefficient of variation")
    w.add_argument("--seed", type=int, default=0)
    o = w.add_argument_group("workload options (docs/workloads.md; each applies to the workloads named)")
    o.add_argument(
        "--time-scale", type=float, metavar="K", help="traces: multiply arrival offsets (2: half the rate)"
    )
    o.add_argument(
        "--slo-ttft-ms", type=float, metavar="MS", help="every request's TTFT target, sent as x-berth-ttft-ms"
    )
    o.add_argument(
        "--slo-itl-ms", type=float, metavar="MS", help="every request's ATGT target, sent as x-berth-itl-ms"
    )
    o.add_argument(
        "--sessions",
        type=int,
        metavar="N",
        help="coding: developer sessions with repository context; chat: conversations",
    )
    o.add_argument(
        "--context-tokens",
        type=_range,
        metavar="LO:HI",
        help="coding: a session's repository context (tokens)",
    )
    o.add_argument("--turns", type=_range, metavar="LO:HI", help="chat: turns per conversation")
    o.add_argument(
        "--think-time", type=float, metavar="S", help="chat: mean seconds between an answer and the next turn"
    )
    o.add_argument(
        "--apps", type=int, metavar="N", help="chat: applications, each with its own system prompt"
    )
    o.add_argument("--system-tokens", type=_range, metavar="LO:HI", help="chat: a system prompt (tokens)")
    return w


def _range(text: str) -> tuple[int, int]:
    try:
        return parse_range(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def workload_options(args: argparse.Namespace) -> WorkloadOptions:
    return WorkloadOptions(
        time_scale=args.time_scale,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_itl_ms=args.slo_itl_ms,
        sessions=args.sessions,
        context_tokens=args.context_tokens,
        turns=args.turns,
        think_time_s=args.think_time,
        apps=args.apps,
        system_tokens=args.system_tokens,
    )


def _client_arguments() -> argparse.ArgumentParser:
    """What `run` and `sim` share: the workload, its schedule, the client's timers and the outputs."""
    w = argparse.ArgumentParser(add_help=False, parents=[_workload_arguments()])
    w.add_argument(
        "--models", help="comma-separated models for slots 0,1,... (default: the target's /v1/models)"
    )
    w.add_argument(
        "--slo-headers", action="store_true", help="also send x-berth-ttft-ms/-itl-ms/-deadline-ms"
    )
    w.add_argument("--timeout", type=float, default=600.0, help="per-request total timeout (s)")
    w.add_argument("--stall-timeout", type=float, default=60.0, help="fail a request silent this long (s)")
    w.add_argument(
        "--drain-timeout", type=float, default=120.0, help="wait this long for in-flight tasks (s)"
    )
    w.add_argument("--out", type=Path, help="write the JSON report here")
    w.add_argument("--plot", type=Path, help="latency CDFs and goodput per class, and a simulation's fleet")
    w.add_argument("-q", "--quiet", action="store_true", help="no table")
    return w


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth-loadgen", description="Workload generator and reports for berth.")
    sub = p.add_subparsers(dest="command", required=True)
    client = _client_arguments()

    r = sub.add_parser("run", parents=[client], help="run a workload and write a JSON report")
    r.add_argument("--target", required=True, help="base URL of berth or an engine (with or without /v1)")
    r.add_argument("--record", type=Path, help="write what was sent and observed as JSONL (replayable)")
    r.add_argument("--berth-pid", type=int, help="report berth's CPU share (from /proc/PID/stat)")
    r.add_argument(
        "--watch-pid", action="append", default=[], metavar="NAME=PID", help="another process to watch"
    )
    r.add_argument(
        "--slo-scale", type=float, default=1.0, help="multiply every SLO (e.g. 0.1 with --speed 10)"
    )
    r.add_argument("--api-key", default=os.environ.get("BERTH_API_KEY"), help="sent as a Bearer token")
    r.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="extra request header")

    s = sub.add_parser(
        "sim",
        parents=[client],
        help="simulate berth in front of a simulated fleet on a virtual clock (loadgen/fleetsim)",
    )
    s.add_argument("--policy", type=Path, help="policy file (default: the packaged default policy)")
    s.add_argument("--fleet", type=Path, required=True, help="fleet file (berth-engine-sim --fleet format)")
    s.add_argument("--gateway", type=Path, help="gateway.toml: its [limits], [scrape] and [telemetry]")

    c = sub.add_parser("compare", help="print reports side by side with ratios to the first")
    c.add_argument("reports", nargs="+", type=Path)

    sub.add_parser("workloads", help="list the built-in workloads")

    st = sub.add_parser(
        "workload-stats",
        parents=[_workload_arguments()],
        help="the share of a workload's prompt blocks that an earlier request sent (its prefix structure)",
    )
    st.add_argument(
        "--block-size",
        type=int,
        action="append",
        metavar="TOKENS",
        help="block size in tokens (repeatable; default 16, vLLM's on GPUs, and 512, the Mooncake traces')",
    )

    b = sub.add_parser(
        "bench", help="run a benchmark (`bench --list`; `bench NAME --help`; docs/benchmarks.md)"
    )
    b.add_argument("--list", action="store_true", help="every benchmark and the question it answers")
    b.add_argument("name", nargs="?", help="the benchmark")
    b.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own options")
    d = sub.add_parser(
        "diag", help="run a diagnostic (`diag --list`; `diag NAME --help`; docs/diagnostics.md)"
    )
    d.add_argument("--list", action="store_true", help="every diagnostic and what it looks into")
    d.add_argument("name", nargs="?", help="the diagnostic")
    d.add_argument("args", nargs=argparse.REMAINDER, help="the diagnostic's own options")
    return p


def _options(args: argparse.Namespace) -> RunOptions:
    headers: dict[str, str] = {}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"--header {h!r}: expected NAME:VALUE")
        headers[name.strip()] = value.strip()
    watch: dict[str, int] = {}
    if args.berth_pid is not None:
        watch["berth"] = args.berth_pid
    for w in args.watch_pid:
        name, sep, pid = w.partition("=")
        if not sep or not pid.isdigit():
            raise ValueError(f"--watch-pid {w!r}: expected NAME=PID")
        watch[name] = int(pid)
    models = tuple(m.strip() for m in args.models.split(",") if m.strip()) if args.models else None
    options = workload_options(args)
    get_workload(args.workload, options)  # fail early on a bad name or option
    return RunOptions(
        target=args.target,
        workload=args.workload,
        workload_options=options,
        rate=args.rate,
        duration_s=args.duration,
        arrival=args.arrival,
        cv=args.cv,
        seed=args.seed,
        models=models,
        headers=headers,
        slo_scale=args.slo_scale,
        slo_headers=args.slo_headers,
        request_timeout_s=args.timeout,
        stall_timeout_s=args.stall_timeout,
        drain_timeout_s=args.drain_timeout,
        watch_pids=watch,
        record=args.record,
    )


def _run(args: argparse.Namespace) -> int:
    try:
        opts = _options(args)
    except ValueError as e:
        print(f"berth-loadgen: {e}", file=sys.stderr)
        return 2
    bar = ProgressBar(sys.stdout) if sys.stdout.isatty() else None

    async def go() -> int:
        report = await run_workload(opts, on_tick=bar.update if bar is not None else None)
        if bar is not None:
            bar.close()
        return _emit(args, report, plot_report)

    try:
        import uvloop

        return uvloop.run(go())
    except KeyboardInterrupt:
        return 130
    except (OSError, RuntimeError, aiohttp.ClientError) as e:
        print(f"berth-loadgen: {e}", file=sys.stderr)
        return 1


def _sim(args: argparse.Namespace) -> int:
    from gateway.core.errors import ConfigError
    from loadgen.engine_sim.fleet import FleetFileError, load_fleet_file
    from loadgen.fleetsim import SimOptions, simulate
    from loadgen.plot import plot_simulation

    try:
        options = workload_options(args)
        get_workload(args.workload, options)
        models = tuple(m.strip() for m in args.models.split(",") if m.strip()) if args.models else None
        opts = SimOptions(
            policy=args.policy,
            fleet=tuple(load_fleet_file(args.fleet)),
            gateway=args.gateway,
            workload=args.workload,
            workload_options=options,
            rate=args.rate,
            duration_s=args.duration,
            arrival=args.arrival,
            cv=args.cv,
            seed=args.seed,
            models=models,
            slo_headers=args.slo_headers,
            request_timeout_s=args.timeout,
            stall_timeout_s=args.stall_timeout,
            drain_timeout_s=args.drain_timeout,
            collector="daemon",  # the daemon's collector schedule: the same report, less collector work
        )
        report = simulate(opts)
    except (ConfigError, FleetFileError, ValueError, OSError) as e:
        print(f"berth-loadgen: {e}", file=sys.stderr)
        return 2
    return _emit(args, report, plot_simulation)


def _workload_stats(args: argparse.Namespace) -> int:
    """Print the reusable share of the workload's prompt blocks at each block size."""
    try:
        workload = get_workload(args.workload, workload_options(args))
        run = RunOptions(
            target="-",
            workload=args.workload,
            rate=args.rate,
            duration_s=args.duration,
            arrival=args.arrival,
            cv=args.cv,
            seed=args.seed,
        )
        tasks = build_schedule(workload, run)
        sizes = args.block_size or [16, 512]
        rows = [reusable_share(tasks, block_tokens=b, seed=args.seed) for b in sizes]
    except (ValueError, OSError) as e:
        print(f"berth-loadgen: {e}", file=sys.stderr)
        return 2
    print(format_reuse(workload.name, rows))
    return 0


def _emit(args: argparse.Namespace, report: Report, plot: Callable[[Report, Path], None]) -> int:
    """A run's outputs: the JSON report (--out), the table (unless -q), the plot (--plot)."""
    if args.out is not None:
        report.write(args.out)
    if not args.quiet:
        print(format_report(report.data))
    if args.plot is not None:
        try:
            plot(report, args.plot)
        except PlotUnavailable as e:
            print(f"berth-loadgen: {e}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "sim":
        return _sim(args)
    if args.command == "bench":
        return _bench(None if args.list else args.name, args.args)
    if args.command == "diag":
        return _diag(None if args.list else args.name, args.args)
    if args.command == "workload-stats":
        return _workload_stats(args)
    if args.command == "compare":
        try:
            reports = [(p.stem, load_report(p)) for p in args.reports]
        except (OSError, ValueError) as e:
            print(f"berth-loadgen: {e}", file=sys.stderr)
            return 2
        print(format_compare(reports))
        return 0
    for name in BUILTIN_NAMES:
        variants = " | ".join(VARIANTS.get(name, ())) or "(no variants)"
        print(f"{name:14} {variants}  (default {get_workload(name).name})")
    print(f"{'mooncake':14} :PATH  (a Mooncake-format trace; docs/workloads.md)")
    print(f"{'PATH':14} a JSONL trace (loadgen/workloads/trace.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
